"""Unit tests of the parameter count and the training-FLOP formula."""

import pytest
import torch
from tests.unit_tests.models.configs import tiny
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from megatron_bridge.models import LlamaModel, num_floating_point_operations, num_parameters


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"share_embeddings_and_output_weights": True},
        {"activation": "gelu", "normalization": "LayerNorm", "add_bias_linear": True},
        {"add_qkv_bias": True, "qk_layernorm": True, "kv_channels": 16, "num_query_groups": 1},
        {"mtp_num_layers": 2},
        {"mtp_num_layers": 1, "num_moe_experts": 4, "moe_router_topk": 2, "moe_shared_expert_intermediate_size": 32,
         "multi_latent_attention": True, "q_lora_rank": None, "kv_lora_rank": 8, "qk_head_dim": 8,
         "qk_pos_emb_head_dim": 4, "v_head_dim": 8},
    ],
)
def test_num_parameters_matches_built_model(overrides: dict[str, object]) -> None:
    cfg = tiny(**overrides)
    model = LlamaModel(cfg, device="meta")
    assert num_parameters(cfg) == sum(p.numel() for p in model.parameters())
    body = sum(p.numel() for n, p in model.named_parameters() if not n.startswith(("embed_tokens", "lm_head")))
    assert num_parameters(cfg, include_embedding=False) == body


def test_num_parameters_hand_count() -> None:
    # h=32, 4 heads of 8, 2 kv heads, ffn 64, 2 layers, vocab 100 -> 112, untied, RMSNorm, SwiGLU, no biases.
    per_layer = 32 + 32 * 32 + 2 * (32 * 16) + 32 * 32 + 32 + 3 * 32 * 64
    assert num_parameters(tiny()) == 2 * per_layer + 32 + 2 * 112 * 32


def test_flops_hand_count() -> None:
    cfg = tiny()  # h=32, d=8, nq=4, nkv=2, f=64, L=2, V=112 (padded), swiglu
    b, s = 3, 10
    q = 2 * 32 * 32  # per token: 2 * h * (nq*d)
    k = v = 2 * 32 * 16  # 2 * h * (nkv*d)
    o = 2 * 32 * 32
    scores = 2 * s * 8 * 4  # QK^T: s keys, d channels, nq heads (full s x s, causal half not subtracted)
    over_values = 2 * s * 8 * 4
    mlp = 3 * 2 * 32 * 64
    logits = 2 * 32 * 112
    forward = b * s * (2 * (q + k + v + o + scores + over_values + mlp) + logits)
    assert num_floating_point_operations(cfg, b, s) == 3 * forward
    assert num_floating_point_operations(cfg, 1) == num_floating_point_operations(cfg, 1, 16)
    gelu = tiny(activation="gelu")
    assert num_floating_point_operations(cfg, b, s) - num_floating_point_operations(gelu, b, s) == 3 * b * s * 2 * (
        2 * 32 * 64
    )


@pytest.mark.parametrize("tied", [False, True, "mtp"])
def test_flops_match_flop_counter_exactly_with_math_attention(tied: bool | str) -> None:
    """FlopCounterMode on a real forward + backward agrees exactly (tolerance 0).

    The math SDPA backend decomposes attention into bmm's, which the counter sees (full s x s, like the formula).
    Every matmul has both an input- and a weight-gradient in backward (the embedding needs the input gradient of
    layer 0), so backward is exactly 2x forward. Norms, softmax, RoPE and the loss are not counted on either side.
    """
    cfg = tiny(share_embeddings_and_output_weights=tied is True, add_bias_linear=True,
               mtp_num_layers=2 if tied == "mtp" else None)  # MTP: two more layers, eh_proj and logits per depth
    torch.manual_seed(0)
    model = LlamaModel(cfg)
    b, s = 2, 12
    ids = torch.randint(0, cfg.vocab_size, (b, s))
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        model(ids, labels=ids).mean().backward()
    assert counter.get_total_flops() == num_floating_point_operations(cfg, b, s)


def test_flop_counter_default_backend_differs_only_by_attention() -> None:
    """With the default SDPA backend the counter sees attention only where it has a formula for the fused kernel.

    On CPU the fused ``_scaled_dot_product_flash_attention_for_cpu`` is not registered in FlopCounterMode, so the
    counted total is the formula minus the attention term; on CUDA the flash/efficient kernels are counted in full.
    """
    cfg = tiny()
    model = LlamaModel(cfg)
    b, s = 2, 12
    ids = torch.randint(0, cfg.vocab_size, (b, s))
    with FlopCounterMode(display=False) as counter:
        model(ids, labels=ids).mean().backward()
    expected = num_floating_point_operations(cfg, b, s)
    attention = 3 * b * s * cfg.num_layers * 2 * (2 * s * cfg.head_dim * cfg.num_attention_heads)
    assert counter.get_total_flops() in (expected, expected - attention)
