"""Every shipped Llama 3 and Qwen3 recipe equals Megatron-Bridge's recipe of the same name, field by field.

The table holds Megatron-Bridge's values as read from NVIDIA-NeMo/Megatron-Bridge at commit ``MB_COMMIT``:
``src/megatron/bridge/recipes/llama/llama3.py``, ``recipes/qwen/qwen3.py`` and ``qwen3_moe.py`` map the names to
the per-GPU H100 recipes in ``recipes/llama/h100/llama3.py`` (``llama3_8b`` =
``llama3_8b_pretrain_2gpu_h100_bf16_config``, ...) and ``recipes/qwen/h100/`` (``qwen3_8b`` =
``qwen3_8b_pretrain_16gpu_h100_bf16_config``, ``qwen3_30b_a3b`` = ``qwen3_30b_a3b_pretrain_16gpu_h100_bf16_config``,
``qwen3_235b_a22b`` = ``qwen3_235b_a22b_pretrain_256gpu_h100_bf16_config``, the dense ones their 1/2/8/16-GPU
recipes), which start from ``recipes/common.py::_pretrain_common``. Where we differ on purpose, ``DIFFERENCES``
says so and docs/megatron-bridge-differences.md explains why.
"""

from pathlib import Path

import pytest

from megatron_bridge.config.mixed_precision import get_mixed_precision_preset
from megatron_bridge.recipes import RECIPES


MB_COMMIT = "067f987df03b8355b03192d88d70f1709fedf51a"
FIELDS = ("gpus", "tp", "pp", "vp", "cp", "ep", "sp", "train_iters", "global_batch_size", "micro_batch_size",
          "lr_warmup_iters", "lr_decay_iters", "eval_interval", "eval_iters", "lr", "min_lr", "grad_reduce_in_fp32",
          "save_interval", "seq_length")
_LLAMA = (1_168_251, 512, 1, 2000, None, 2000, 32, 3e-4, 3e-5, True, 500)  # its Llama 3 recipes' training values
_COMMON = (300_000, 32, 2, 500, None, 500, 32, 3e-4, 3e-5, True, 500, 4096)  # _pretrain_common's training values
_COHORT = (100, 1024, 1, 40, 100, 500, 32, 3e-4, 3e-5, False, 50, 4096)  # the 16-GPU convergence recipes
MB_VALUES: dict[str, tuple] = {
    "llama3_8b": (2, 1, 1, None, 2, 1, False, *_LLAMA, 8192),
    "llama3_8b_16k": (16, 4, 2, None, 2, 1, True, *_LLAMA, 16384),
    "llama3_8b_64k": (32, 4, 2, None, 4, 1, True, *_LLAMA, 65536),
    "llama3_8b_128k": (64, 4, 2, None, 8, 1, True, *_LLAMA, 131072),
    "llama3_70b": (32, 4, 4, 5, 2, 1, True, *_LLAMA, 8192),
    "llama3_70b_16k": (32, 8, 2, None, 2, 1, True, *_LLAMA, 16384),
    "llama3_70b_64k": (256, 8, 4, None, 8, 1, True, *_LLAMA, 65536),
    "llama31_8b": (2, 1, 1, None, 2, 1, False, *_LLAMA, 8192),
    "llama31_70b": (32, 4, 4, 5, 2, 1, True, *_LLAMA, 131072),
    "llama31_405b": (256, 8, 8, 2, 4, 1, True, *_LLAMA, 131072),
    "llama32_1b": (1, 1, 1, None, 1, 1, False, *_LLAMA, 8192),
    "llama32_3b": (1, 1, 1, None, 1, 1, False, *_LLAMA, 8192),
    "qwen3_600m": (1, 1, 1, None, 1, 1, False, *_COMMON),
    "qwen3_1p7b": (1, 1, 1, None, 1, 1, False, *_COMMON),
    "qwen3_4b": (2, 2, 1, None, 1, 1, False, *_COMMON),
    "qwen3_8b": (16, 1, 1, None, 1, 1, False, *_COHORT),
    "qwen3_14b": (8, 8, 1, None, 1, 1, False, *_COMMON),
    "qwen3_32b": (16, 8, 2, None, 1, 1, False, *_COMMON),
    "qwen3_30b_a3b": (16, 1, 1, None, 1, 16, False, *_COHORT),
    "qwen3_235b_a22b": (256, 4, 16, None, 2, 8, True, 300_000, 32, 1, 500, None, 500, 32, 3e-4, 3e-5, True, 500,
                        4096),
}
"""Megatron-Bridge's values at ``MB_COMMIT``, in ``FIELDS`` order (``gpus``: the world size the recipe is for)."""
DIFFERENCES = {("qwen3_235b_a22b", "gpus"): 512, ("qwen3_235b_a22b", "global_batch_size"): 64}
"""Ours where we differ on purpose: EP is carved out of DP × CP here (docs/megatron-bridge-differences.md, MoE
parallel folding), so the 235B layout needs DP 4; the batch keeps Megatron-Bridge's 16 micro-batches per rank."""
DOC = Path(__file__).resolve().parents[3] / "docs" / "megatron-bridge-differences.md"


def _ours(name: str) -> dict[str, object]:
    info = RECIPES[name]
    cfg = info.fn()
    m, mp = cfg.model, cfg.mixed_precision
    preset = get_mixed_precision_preset(mp) if isinstance(mp, str) else mp
    values = (info.world_size, m.tensor_model_parallel_size, m.pipeline_model_parallel_size,
              m.virtual_pipeline_model_parallel_size, m.context_parallel_size,
              m.expert_model_parallel_size, m.sequence_parallel, cfg.train.train_iters, cfg.train.global_batch_size,
              cfg.train.micro_batch_size, cfg.scheduler.lr_warmup_iters, cfg.scheduler.lr_decay_iters,
              cfg.validation.eval_interval, cfg.validation.eval_iters, cfg.optimizer.lr, cfg.optimizer.min_lr,
              preset.grad_reduce_in_fp32, cfg.checkpoint.save_interval, m.seq_length)
    assert preset.grad_reduce_in_fp32 == cfg.ddp.grad_reduce_in_fp32, name  # the preset copies it at finalize
    return dict(zip(FIELDS, values, strict=True))


def test_every_shipped_recipe_is_in_the_table() -> None:
    """All but this library's own tiny CPU recipes."""
    assert sorted(n for n in RECIPES if not n.startswith("tiny_")) == sorted(MB_VALUES)


@pytest.mark.parametrize("name", sorted(MB_VALUES))
def test_recipe_equals_megatron_bridges(name: str) -> None:
    ours = _ours(name)
    expected = {field: DIFFERENCES.get((name, field), value)
                for field, value in zip(FIELDS, MB_VALUES[name], strict=True)}
    assert {f: v for f, v in ours.items() if v != expected[f]} == {}, f"{name} differs from Megatron-Bridge"
    RECIPES[name].fn().validate(world_size=ours["gpus"])


def test_differences_are_documented() -> None:
    text = DOC.read_text()
    assert "235B recipe keeps the layout on 512 GPUs (DP 4) with global batch 64" in text


def test_megatron_bridge_import_path() -> None:
    from megatron_bridge.recipes.qwen import qwen3_30b_a3b_pretrain_config, qwen3_235b_a22b_pretrain_config

    assert qwen3_30b_a3b_pretrain_config is RECIPES["qwen3_30b_a3b"].fn
    assert qwen3_235b_a22b_pretrain_config is RECIPES["qwen3_235b_a22b"].fn
