"""Tiny random Hugging Face models of every family and variant we convert, built locally from configs."""

import json
from pathlib import Path

import torch


VOCAB = 120
"""Not a multiple of make_vocab_size_divisible_by: imports pad the vocabulary, exports cut it back."""

_BASE = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "vocab_size": VOCAB, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0}
_LLAMA31_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                 "original_max_position_embeddings": 64}

_DEEPSEEK = {"num_key_value_heads": 4, "num_hidden_layers": 3, "first_k_dense_replace": 1, "kv_lora_rank": 12,
             "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 6, "n_routed_experts": 8,
             "num_experts_per_tok": 2, "moe_intermediate_size": 16, "n_shared_experts": 1, "rms_norm_eps": 1e-6}
"""DeepSeek-V3's shape at test size: MLA (kv latent 12, heads 8 + 4 RoPE, values 6), a dense first layer, 8 experts
of width 16 top-2 with a shared expert."""

VARIANTS: dict[str, tuple[str, dict]] = {
    "llama3": ("llama", {"rope_parameters": {"rope_type": "default", "rope_theta": 500000.0},
                         "max_position_embeddings": 256}),
    "llama3.1": ("llama", {"rope_parameters": {**_LLAMA31_ROPE, "rope_theta": 500000.0},
                           "max_position_embeddings": 512}),
    "llama3.2-tied": ("llama", {"rope_parameters": {**_LLAMA31_ROPE, "factor": 32.0, "rope_theta": 500000.0},
                                "max_position_embeddings": 512, "tie_word_embeddings": True}),
    "llama3-yarn": ("llama", {"rope_parameters": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                                  "original_max_position_embeddings": 16},
                              "max_position_embeddings": 64}),
    "qwen3-yarn-mscale": ("qwen3", {"head_dim": 16, "max_position_embeddings": 64, "rope_parameters": {
        "rope_type": "yarn", "rope_theta": 1000000.0, "factor": 8.0, "original_max_position_embeddings": 8,
        "beta_fast": 16.0, "beta_slow": 2.0, "mscale": 0.707, "mscale_all_dim": 0.5, "truncate": False}}),
    "llama3-biases": ("llama", {"attention_bias": True, "mlp_bias": False, "rms_norm_eps": 1e-5}),
    "qwen3-tied": ("qwen3", {"head_dim": 16, "tie_word_embeddings": True,
                             "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0}}),
    "qwen3": ("qwen3", {"head_dim": 16, "tie_word_embeddings": False, "attention_bias": True}),
    "mistral-window8": ("mistral", {"sliding_window": 8, "head_dim": 16, "rms_norm_eps": 1e-5,
                                    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}),
    "mistral-full": ("mistral", {"sliding_window": None}),
    "mixtral": ("mixtral", {"num_local_experts": 4, "num_experts_per_tok": 2, "sliding_window": 8,
                            "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0}}),
    "deepseek-v3": ("deepseek_v3", {**_DEEPSEEK, "q_lora_rank": 16, "n_group": 2, "topk_group": 1,
                                    "routed_scaling_factor": 2.5, "max_position_embeddings": 64, "rope_parameters": {
                                        "rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "mscale": 0.707,
                                        "mscale_all_dim": 0.5, "original_max_position_embeddings": 16,
                                        "beta_fast": 32.0, "beta_slow": 1.0, "truncate": True}}),
    "moonlight": ("deepseek_v3", {**_DEEPSEEK, "q_lora_rank": None, "n_group": 1, "topk_group": 1,
                                  "num_experts_per_tok": 3, "n_shared_experts": 2, "routed_scaling_factor": 2.446,
                                  "rope_parameters": {"rope_type": "default", "rope_theta": 50000.0}}),
    "deepseek-v2-lite": ("deepseek_v2", {**_DEEPSEEK, "q_lora_rank": None, "n_group": 1, "topk_group": 1,
                                         "topk_method": "greedy", "norm_topk_prob": False, "n_shared_experts": 2,
                                         "num_experts_per_tok": 3, "routed_scaling_factor": 1.0,
                                         "max_position_embeddings": 64, "rope_parameters": {
                                             "rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                             "mscale": 0.707, "mscale_all_dim": 0.707,
                                             "original_max_position_embeddings": 16, "beta_fast": 32.0,
                                             "beta_slow": 1.0, "truncate": True}}),
    "deepseek-v2-groups": ("deepseek_v2", {**_DEEPSEEK, "q_lora_rank": 16, "n_group": 4, "topk_group": 2,
                                           "topk_method": "group_limited_greedy", "norm_topk_prob": False,
                                           "routed_scaling_factor": 2.0,
                                           "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}),
    "qwen3-moe": ("qwen3_moe", {"head_dim": 16, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 24,
                                "norm_topk_prob": True, "mlp_only_layers": [0]}),
    "gpt-oss": ("gpt_oss", {"head_dim": 16, "num_local_experts": 4, "num_experts_per_tok": 2, "sliding_window": 8,
                            "layer_types": ["sliding_attention", "full_attention"], "max_position_embeddings": 64,
                            "rope_parameters": {"rope_type": "yarn", "rope_theta": 150000.0, "factor": 4.0,
                                                "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                                                "original_max_position_embeddings": 16}}),
    "gemma3": ("gemma3", {"head_dim": 16, "sliding_window": 8, "query_pre_attn_scalar": 24,
                          "layer_types": ["sliding_attention", "full_attention"],
                          "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
                                              "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}}),
    "gemma3-linear-rope": ("gemma3", {"head_dim": 16, "sliding_window": 6, "query_pre_attn_scalar": 16,
                                      "layer_types": ["full_attention", "sliding_attention"], "rope_parameters": {
                                          "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
                                          "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}}),
    "gemma2": ("gemma2", {"head_dim": 16, "sliding_window": 8, "query_pre_attn_scalar": 24,
                          "attn_logit_softcapping": 0.25, "final_logit_softcapping": 1.5, "tie_word_embeddings": False,
                          "layer_types": ["sliding_attention", "full_attention"],
                          "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}),
    "gemma2-tied-uncapped": ("gemma2", {"head_dim": 16, "sliding_window": 6, "query_pre_attn_scalar": 16,
                                     "attn_logit_softcapping": None, "final_logit_softcapping": None,
                                     "num_hidden_layers": 3, "rope_parameters": {"rope_type": "default",
                                                                                 "rope_theta": 100000.0}}),
}
"""The Gemma 2 variants: caps small enough that they bend a random model's scores and logits (so a missing cap
shows), untied; ``gemma2-tied-uncapped`` has null caps, tied embeddings and transformers' default ``layer_types``
(window, full, window)."""


def hf_config(variant: str):  # noqa: ANN201  (a transformers config)
    """The transformers config of ``variant``: transformers' config class of the family's HF ``model_type``."""
    from transformers import AutoConfig

    from megatron_bridge.config.families import get_family

    family, extra = VARIANTS[variant]
    return AutoConfig.for_model(get_family(family).hf_model_type, **{**_BASE, **extra})


def hf_model(variant: str, seed: int = 0):  # noqa: ANN201
    """A random fp32 ``*ForCausalLM`` of ``variant``; norms and biases are random too (so no mapping hides)."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(hf_config(variant), dtype=torch.float32)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.copy_(1.0 + 0.1 * torch.randn_like(param))
            elif name.endswith("bias"):
                param.copy_(0.05 * torch.randn_like(param))
            elif name.endswith("gate_up_proj"):  # GPT-OSS: large enough that the clamp (swiglu_limit 7) acts
                param.mul_(200.0)
        for name, buffer in model.named_buffers():
            if name.endswith("e_score_correction_bias"):  # DeepSeek-V3's expert bias: choice only, so make it count
                buffer.copy_(0.1 * torch.randn_like(buffer))
    return model.eval()


def to_rope_scaling_format(folder: Path) -> None:
    """Rewrite a folder's config.json as transformers 4.x wrote it: top-level ``rope_theta`` and ``rope_scaling``
    (null without scaling)."""
    path = folder / "config.json"
    config = json.loads(path.read_text())
    params = config.pop("rope_parameters")
    config["rope_theta"] = params.pop("rope_theta")
    config["rope_scaling"] = None if params.get("rope_type") == "default" else params
    path.write_text(json.dumps(config, indent=2))


def to_bin(folder: Path, shards: int = 1) -> None:
    """Replace a folder's safetensors by ``pytorch_model.bin`` (or ``shards`` bin shards + index)."""
    from safetensors.torch import load_file

    tensors = load_file(str(folder / "model.safetensors"))
    (folder / "model.safetensors").unlink()
    names = list(tensors)
    if shards == 1:
        torch.save(tensors, folder / "pytorch_model.bin")
        return
    weight_map = {}
    for i in range(shards):
        part = names[i::shards]
        file = f"pytorch_model-{i + 1:05d}-of-{shards:05d}.bin"
        torch.save({k: tensors[k] for k in part}, folder / file)
        weight_map.update(dict.fromkeys(part, file))
    (folder / "pytorch_model.bin.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


@torch.no_grad()
def hf_logits(model, tokens: torch.Tensor) -> torch.Tensor:  # noqa: ANN001
    """Logits of a transformers model."""
    return model(input_ids=tokens).logits


@torch.no_grad()
def our_logits(model, tokens: torch.Tensor) -> torch.Tensor:  # noqa: ANN001
    """Logits of our model over the real vocabulary (padding rows dropped)."""
    return model(tokens)[..., :VOCAB]


@torch.no_grad()
def our_greedy(model, prompt: torch.Tensor, new_tokens: int, eos: int | None) -> list[int]:
    """Greedy decoding with our model (full recompute per token), stopping after ``eos`` as HF generate does."""
    ids = prompt.clone()
    for _ in range(new_tokens):
        nxt = our_logits(model, ids)[:, -1].argmax(-1, keepdim=True)
        ids = torch.cat([ids, nxt], dim=1)
        if eos is not None and int(nxt) == eos:
            break
    return ids[0].tolist()


def write_tokenizer(folder: Path) -> None:
    """A tiny word-level ``tokenizer.json`` of ``VOCAB`` ids (0 <pad>, 1 <|begin_of_text|>, 2 <|end_of_text|>)
    with ``tokenizer_config.json`` and ``generation_config.json``, as a HF model folder carries them."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    vocab = {"<pad>": 0, "<|begin_of_text|>": 1, "<|end_of_text|>": 2, "[UNK]": 3}
    vocab.update({f"w{i}": i for i in range(4, VOCAB)})
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(single="<|begin_of_text|> $A",
                                                       special_tokens=[("<|begin_of_text|>", 1)])
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>", "pad_token": "<pad>"}))
    (folder / "generation_config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": 2,
                                                               "pad_token_id": 0, "do_sample": False}))
