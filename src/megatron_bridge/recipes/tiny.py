"""A tiny Llama (and its mixture-of-experts sibling) that trains on a 2-core CPU in minutes (the README's main job
and the tests use them)."""

from typing import Any

from megatron_bridge.config.checkpoint import CheckpointConfig
from megatron_bridge.config.container import ConfigContainer
from megatron_bridge.config.data import DatasetConfig, TokenizerConfig
from megatron_bridge.config.logger import LoggerConfig
from megatron_bridge.config.model import ModelConfig
from megatron_bridge.config.optimizer import OptimizerConfig, SchedulerConfig
from megatron_bridge.config.train import TrainingConfig, ValidationConfig
from megatron_bridge.recipes.base import apply_common_overrides


BYTE_TOKENIZER_VOCAB = 258
"""256 byte ids plus <eod> and <pad> (megatron_bridge.data.tokenizers.ByteTokenizer)."""


def tiny_llama_pretrain_config(**overrides: Any) -> ConfigContainer:
    """4 layers, hidden 128, 4 heads / 2 KV groups, seq 128, byte-level vocab; fp32, AdamW 1e-3 cosine with 5%
    warmup, 300 steps of 16 samples. Mock data by default; pass ``data_path=[prefix]`` to train on indexed text."""
    model = ModelConfig(family="llama", num_layers=4, hidden_size=128, ffn_hidden_size=352, num_attention_heads=4,
                        num_query_groups=2, vocab_size=BYTE_TOKENIZER_VOCAB, seq_length=128, rotary_base=10000.0)
    cfg = ConfigContainer(
        model=model,
        train=TrainingConfig(train_iters=300, global_batch_size=16, micro_batch_size=4),
        validation=ValidationConfig(eval_interval=100, eval_iters=4),
        optimizer=OptimizerConfig(optimizer="adam", lr=1e-3, min_lr=1e-4, weight_decay=0.1, adam_beta2=0.95,
                                  clip_grad=1.0),
        scheduler=SchedulerConfig(lr_warmup_fraction=0.05, lr_decay_style="cosine"),
        dataset=DatasetConfig(mock=True, seq_length=model.seq_length, split="95,5,0"),
        tokenizer=TokenizerConfig(tokenizer_type="byte"),
        logger=LoggerConfig(log_interval=10, log_timers_to_tensorboard=True, log_throughput=True,
                            log_throughput_to_tensorboard=True, log_memory_to_tensorboard=True),
        checkpoint=CheckpointConfig(save_interval=100, most_recent_k=2, ckpt_format="torch_dist"),
        mixed_precision="fp32",
    )
    return apply_common_overrides(cfg, **overrides)


def tiny_moe_pretrain_config(**overrides: Any) -> ConfigContainer:
    """The tiny Llama with every MLP replaced by a mixture of experts: 8 routed SwiGLU experts of width 96, top-2
    softmax routing, switch aux loss 1e-2, grouped matmuls; expert parallelism over 2 ranks (4 experts each).
    Same data, optimizer and schedule as :func:`tiny_llama_pretrain_config`; pass ``expert_model_parallel_size=1``
    for a single process."""
    cfg = tiny_llama_pretrain_config()
    m = cfg.model
    m.num_moe_experts, m.moe_ffn_hidden_size, m.moe_router_topk = 8, 96, 2
    m.moe_aux_loss_coeff, m.moe_grouped_gemm = 1e-2, True
    m.expert_model_parallel_size = 2
    return apply_common_overrides(cfg, **overrides)
