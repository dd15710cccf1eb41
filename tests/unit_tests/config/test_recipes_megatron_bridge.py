"""Every shipped Llama 3 and Qwen3 recipe equals Megatron-Bridge's recipe of the same name, field by field.

The table holds Megatron-Bridge's values as read from NVIDIA-NeMo/Megatron-Bridge at commit ``MB_COMMIT``:
``src/megatron/bridge/recipes/llama/llama3.py``, ``recipes/qwen/qwen3.py`` and ``qwen3_moe.py`` map the names to
the per-GPU H100 recipes in ``recipes/llama/h100/llama3.py`` (``llama3_8b`` =
``llama3_8b_pretrain_2gpu_h100_bf16_config``, ...) and ``recipes/qwen/h100/`` (``qwen3_8b`` =
``qwen3_8b_pretrain_16gpu_h100_bf16_config``, ``qwen3_30b_a3b`` = ``qwen3_30b_a3b_pretrain_16gpu_h100_bf16_config``,
``qwen3_235b_a22b`` = ``qwen3_235b_a22b_pretrain_256gpu_h100_bf16_config``, the dense ones their 1/2/8/16-GPU
recipes), which start from ``recipes/common.py::_pretrain_common``. ``PER_GPU`` lists the per-GPU pretraining
names of its ``recipes/llama/h100``, ``recipes/qwen/h100`` and ``recipes/qwen/gb200`` packages for our families, each
either the short name it stands for or its own values. Where we differ on purpose, ``DIFFERENCES`` says so and
docs/megatron-bridge-differences.md explains why.
"""

import argparse
import hashlib
import importlib
import json
import re
from pathlib import Path

import pytest

from megatron_bridge.config.mixed_precision import MixedPrecisionConfig, get_mixed_precision_preset
from megatron_bridge.errors import ConfigValidationError
from megatron_bridge.perf.args import build_config, build_parser, environment
from megatron_bridge.recipes import RECIPES
from megatron_bridge.recipes.perf_configs import PERF_CONFIGS, get_perf_config, perf_config_key
from megatron_bridge.recipes.perf_tables import MB_COMMIT as PERF_TABLES_COMMIT
from megatron_bridge.recipes.perf_tables import ROWS
from tests.unit_tests.config.mb_perf_values import FIELDS as PERF_FIELDS
from tests.unit_tests.config.mb_perf_values import MB_COMMIT as PERF_MB_COMMIT
from tests.unit_tests.config.mb_perf_values import MB_PERF_VALUES


MB_COMMIT = "067f987df03b8355b03192d88d70f1709fedf51a"
FIELDS = ("gpus", "tp", "pp", "vp", "cp", "ep", "sp", "train_iters", "global_batch_size", "micro_batch_size",
          "lr_warmup_iters", "lr_decay_iters", "eval_interval", "eval_iters", "lr", "min_lr", "grad_reduce_in_fp32",
          "save_interval", "seq_length", "low_precision", "deterministic")
_LLAMA = (1_168_251, 512, 1, 2000, None, 2000, 32, 3e-4, 3e-5, True, 500)  # its Llama 3 recipes' training values
_LOW_PRECISION = (1_168_251, 768, 1, 2000, None, 2000, 32, 6e-4, 6e-6, True, 500)  # _llama3_8b_..._low_precision
_BF16 = (None, False)  # bf16_mixed (no FP8/FP4), not deterministic
_COMMON = (300_000, 32, 2, 500, None, 500, 32, 3e-4, 3e-5, True, 500, 4096, *_BF16)  # _pretrain_common's values
_COHORT = (100, 1024, 1, 40, 100, 500, 32, 3e-4, 3e-5, False, 50, 4096, *_BF16)  # the 16-GPU convergence recipes
_DEEPSEEK_V3 = (1_000_000, 4096, 1, 2000, None, 2000, 32, 3e-4, 3e-5, False, 2000, 4096, *_BF16)
"""recipes/deepseek/h100/deepseek_v3.py's training values (both layouts); moonlight/h100/moonlight_16b.py below."""
_GPT_OSS = (1_000_000, 512, 1, 2000, None, 2000, 32, 3e-4, 3e-5, True, 500, 4096, *_BF16)
"""recipes/gpt_oss/gpt_oss.py's training values (20B and 120B), read from the stored Megatron-Bridge source (its
flattened ``_pretrain_common`` form; not re-read at MB_COMMIT)."""
_GEMMA2 = (300_000, 32, 2, 500, None, 500, 32, 3e-4, 3e-5, False, 500, 4096, *_BF16)
"""recipes/gemma/h100/gemma2.py's ``gemma2_2b_pretrain_2gpu_h100_bf16_config`` (``_pretrain_common`` with
``ddp.grad_reduce_in_fp32=False``), read from the stored Megatron-Bridge source (not re-read at MB_COMMIT)."""
MB_VALUES: dict[str, tuple] = {
    "llama3_8b": (2, 1, 1, None, 2, 1, False, *_LLAMA, 8192, *_BF16),
    "llama3_8b_16k": (16, 4, 2, None, 2, 1, True, *_LLAMA, 16384, *_BF16),
    "llama3_8b_64k": (32, 4, 2, None, 4, 1, True, *_LLAMA, 65536, *_BF16),
    "llama3_8b_128k": (64, 4, 2, None, 8, 1, True, *_LLAMA, 131072, *_BF16),
    "llama3_8b_low_precision": (2, 1, 1, None, 2, 1, False, *_LOW_PRECISION, 8192, ("tensorwise", 1, 1), False),
    "llama3_70b": (32, 4, 4, 5, 2, 1, True, *_LLAMA, 8192, *_BF16),
    "llama3_70b_deterministic": (32, 4, 4, 5, 2, 1, True, *_LLAMA, 8192, None, True),
    "llama3_70b_16k": (32, 8, 2, None, 2, 1, True, *_LLAMA, 16384, *_BF16),
    "llama3_70b_64k": (256, 8, 4, None, 8, 1, True, *_LLAMA, 65536, *_BF16),
    "llama31_8b": (2, 1, 1, None, 2, 1, False, *_LLAMA, 8192, *_BF16),
    "llama31_70b": (32, 4, 4, 5, 2, 1, True, *_LLAMA, 131072, *_BF16),
    "llama31_405b": (256, 8, 8, 2, 4, 1, True, *_LLAMA, 131072, *_BF16),
    "llama31_405b_deterministic": (256, 8, 8, 2, 4, 1, True, *_LLAMA, 131072, None, True),
    "llama32_1b": (1, 1, 1, None, 1, 1, False, *_LLAMA, 8192, *_BF16),
    "llama32_3b": (1, 1, 1, None, 1, 1, False, *_LLAMA, 8192, *_BF16),
    "gemma3_1b": (1, 1, 1, None, 1, 1, False, *_LLAMA, 32768, *_BF16),
    "gemma2_2b": (2, 2, 1, None, 1, 1, False, *_GEMMA2),
    "qwen3_600m": (1, 1, 1, None, 1, 1, False, *_COMMON),
    "qwen3_1p7b": (1, 1, 1, None, 1, 1, False, *_COMMON),
    "qwen3_4b": (2, 2, 1, None, 1, 1, False, *_COMMON),
    "qwen3_8b": (16, 1, 1, None, 1, 1, False, *_COHORT),
    "qwen3_14b": (8, 8, 1, None, 1, 1, False, *_COMMON),
    "qwen3_32b": (16, 8, 2, None, 1, 1, False, *_COMMON),
    "qwen3_30b_a3b": (16, 1, 1, None, 1, 16, False, *_COHORT),
    "qwen3_235b_a22b": (256, 4, 16, None, 2, 8, True, 300_000, 32, 1, 500, None, 500, 32, 3e-4, 3e-5, True, 500,
                        4096, *_BF16),
    "deepseek_v3": (1024, 2, 16, None, 1, 64, True, *_DEEPSEEK_V3),
    "deepseek_v3_32nodes": (256, 2, 8, None, 1, 32, True, *_DEEPSEEK_V3),
    "gpt_oss_20b": (16, 2, 4, None, 1, 4, True, *_GPT_OSS),
    "gpt_oss_120b": (64, 2, 4, None, 1, 16, True, *_GPT_OSS),
    "moonlight_16b": (8, 2, 1, None, 1, 8, True, 500_000, 2048, 1, 2000, 500_000, 2000, 32, 3e-4, 3e-5, False,
                      2000, 4096, *_BF16),
    "moonlight_16b_16gpu": (16, 1, 1, None, 1, 8, False, 100, 1024, 2, 40, 100, 2000, 32, 3e-4, 3e-5, False, 50,
                            4096, *_BF16),
}
"""Megatron-Bridge's values at ``MB_COMMIT``, in ``FIELDS`` order (``gpus``: the world size the recipe is for)."""
_FP8_8B = (2, 1, 1, None, 2, 1, False, *_LOW_PRECISION, 8192)
PER_GPU: dict[str, dict[str, str | tuple]] = {
    "llama.h100": {
        "llama32_1b_pretrain_1gpu_h100_bf16_config": "llama32_1b",
        "llama32_3b_pretrain_1gpu_h100_bf16_config": "llama32_3b",
        "llama3_8b_pretrain_2gpu_h100_bf16_config": "llama3_8b",
        "llama3_8b_pretrain_16gpu_h100_bf16_16k_config": "llama3_8b_16k",
        "llama3_8b_pretrain_32gpu_h100_bf16_64k_config": "llama3_8b_64k",
        "llama3_8b_pretrain_64gpu_h100_bf16_128k_config": "llama3_8b_128k",
        "llama3_8b_pretrain_2gpu_h100_fp8cs_config": "llama3_8b_low_precision",
        "llama3_8b_pretrain_2gpu_h100_fp8mx_config": (*_FP8_8B, ("mxfp8", 0, 0), False),
        "llama3_8b_pretrain_2gpu_h100_nvfp4_config": (*_FP8_8B, ("nvfp4", 0, 4), False),
        "llama3_70b_pretrain_32gpu_h100_bf16_config": "llama3_70b",
        "llama3_70b_pretrain_32gpu_h100_bf16_deterministic_config": "llama3_70b_deterministic",
        "llama3_70b_pretrain_32gpu_h100_bf16_16k_config": "llama3_70b_16k",
        "llama3_70b_pretrain_256gpu_h100_bf16_64k_config": "llama3_70b_64k",
        "llama31_8b_pretrain_2gpu_h100_bf16_config": "llama31_8b",
        "llama31_70b_pretrain_32gpu_h100_bf16_config": "llama31_70b",
        "llama31_405b_pretrain_256gpu_h100_bf16_config": "llama31_405b",
        "llama31_405b_pretrain_256gpu_h100_bf16_deterministic_config": "llama31_405b_deterministic",
    },
    "qwen.h100": {
        "qwen3_600m_pretrain_1gpu_h100_bf16_config": "qwen3_600m",
        "qwen3_1p7b_pretrain_1gpu_h100_bf16_config": "qwen3_1p7b",
        "qwen3_4b_pretrain_2gpu_h100_bf16_config": "qwen3_4b",
        "qwen3_8b_pretrain_4gpu_h100_bf16_config": (4, 4, 1, None, 1, 1, False, *_COMMON),
        "qwen3_8b_pretrain_16gpu_h100_bf16_config": "qwen3_8b",
        "qwen3_14b_pretrain_8gpu_h100_bf16_config": "qwen3_14b",
        "qwen3_32b_pretrain_16gpu_h100_bf16_config": "qwen3_32b",
        "qwen3_30b_a3b_pretrain_8gpu_h100_bf16_config": (8, 4, 2, None, 1, 4, True, *_COMMON),
        "qwen3_30b_a3b_pretrain_16gpu_h100_bf16_config": "qwen3_30b_a3b",
        "qwen3_235b_a22b_pretrain_256gpu_h100_bf16_config": "qwen3_235b_a22b",
    },
    "qwen.gb200": {
        "qwen3_30b_a3b_pretrain_8gpu_gb200_fp8mx_functional_config": (
            8, 1, 1, None, 1, 8, False, 100, 512, 4, 40, 100, 0, 0, 3e-4, 3e-5, False, 50, 4096, ("mxfp8", 0, 0),
            False),
    },
}
"""Megatron-Bridge's per-GPU pretraining names at ``MB_COMMIT`` for the Llama 3 and Qwen3 families, by our module
(``megatron_bridge.recipes.<key>``): the short name it stands for, or its values in ``FIELDS`` order."""
DIFFERENCES = {("qwen3_30b_a3b_pretrain_8gpu_gb200_fp8mx_functional_config", "eval_interval"): None}
"""Ours where we differ on purpose: evaluation off is ``eval_interval=None`` here (0 there). (The MoE recipes run at
Megatron-Bridge's own world sizes: EP folds over the TP × CP × DP ranks, as in megatron-core.)"""
CAPABILITY = {"h100": (9, 0), "gb200": (10, 0)}
"""Compute capability of the GPU a recipe is laid out for: FP8/FP4 recipes validate against it (CUDA mocked, the
boundary), MXFP8 (Blackwell only) against a Blackwell GPU whatever its name says."""
DOC = Path(__file__).resolve().parents[3] / "docs" / "megatron-bridge-differences.md"


def _low_precision(mp: MixedPrecisionConfig) -> tuple | None:
    """None for bf16; else (FP8/FP4 recipe, layers kept in bf16 at the start, at the end)."""
    if not (mp.fp8 or mp.fp4):
        return None
    keep = (mp.num_layers_at_start_in_bf16, mp.num_layers_at_end_in_bf16) if mp.first_last_layers_bf16 else (0, 0)
    return (mp.fp4_recipe if mp.fp4 else mp.fp8_recipe, *keep)


def _values(fn, world_size: int) -> dict[str, object]:  # noqa: ANN001
    cfg = fn()
    m, mp = cfg.model, cfg.mixed_precision
    preset = get_mixed_precision_preset(mp) if isinstance(mp, str) else mp
    values = (world_size, m.tensor_model_parallel_size, m.pipeline_model_parallel_size,
              m.virtual_pipeline_model_parallel_size, m.context_parallel_size,
              m.expert_model_parallel_size, m.sequence_parallel, cfg.train.train_iters, cfg.train.global_batch_size,
              cfg.train.micro_batch_size, cfg.scheduler.lr_warmup_iters, cfg.scheduler.lr_decay_iters,
              cfg.validation.eval_interval, cfg.validation.eval_iters, cfg.optimizer.lr, cfg.optimizer.min_lr,
              preset.grad_reduce_in_fp32, cfg.checkpoint.save_interval, m.seq_length, _low_precision(preset),
              m.deterministic_mode)
    assert preset.grad_reduce_in_fp32 == cfg.ddp.grad_reduce_in_fp32, fn  # the preset copies it at finalize
    return dict(zip(FIELDS, values, strict=True))


def _expected(name: str, table_values: tuple) -> dict[str, object]:
    return {field: DIFFERENCES.get((name, field), value) for field, value in zip(FIELDS, table_values, strict=True)}


def _validate(fn, world_size: int, gpu: str, low_precision: tuple | None,  # noqa: ANN001
              monkeypatch: pytest.MonkeyPatch) -> None:
    """validate() at the world size; FP8/FP4 on the recipe's GPU (mocked capability). NVFP4 has no torchao
    recipe: on the native engine it is refused by name (transformer-engine runs it, on a Blackwell GPU)."""
    import megatron_bridge.utils.packages as packages

    if low_precision is None:
        fn().validate(world_size=world_size)
        return
    blackwell = low_precision[0] in ("mxfp8", "nvfp4")
    monkeypatch.setattr(packages, "cuda_capability", lambda: CAPABILITY["gb200" if blackwell else gpu])
    if low_precision[0] == "nvfp4":
        with pytest.raises(ConfigValidationError, match=r"'nvfp4': torchao has no NVFP4 training recipe.*"
                                                        r"\[rule fp8_requirements\]"):
            fn().validate(world_size=world_size)
        return
    fn().validate(world_size=world_size)


OWN_FAMILIES = ("mistral", "mixtral")
"""Families Megatron-Bridge converts but ships no pretraining recipe for (docs/megatron-bridge-differences.md): their
recipes here have no Megatron-Bridge values to equal."""


NOT_READ = {"deepseek_v2_lite": "Megatron-Bridge's deepseek_v2_lite_pretrain_8gpu_h100_bf16_config was not read "
                                  "into this table: ours is DeepSeek-V2-Lite's Hugging Face architecture with this "
                                  "library's training defaults (families/deepseek_v2/recipes.py)"}
"""Shipped recipes whose Megatron-Bridge counterpart's values are not in :data:`MB_VALUES`, with the reason."""


def test_every_shipped_recipe_is_in_the_table() -> None:
    """All but this library's own tiny CPU recipes, those of :data:`OWN_FAMILIES` and :data:`NOT_READ`."""
    ours = [name for name, info in RECIPES.items()
            if not name.startswith("tiny_") and info.fn().model.family not in OWN_FAMILIES and name not in NOT_READ]
    assert sorted(ours) == sorted(MB_VALUES)


@pytest.mark.parametrize("name", sorted(MB_VALUES))
def test_recipe_equals_megatron_bridges(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    info = RECIPES[name]
    ours = _values(info.fn, info.world_size)
    expected = _expected(name, MB_VALUES[name])
    assert {f: v for f, v in ours.items() if v != expected[f]} == {}, f"{name} differs from Megatron-Bridge"
    _validate(info.fn, ours["gpus"], "h100", ours["low_precision"], monkeypatch)


_PER_GPU_NAMES = [(module, name) for module, names in PER_GPU.items() for name in names]


@pytest.mark.parametrize(("module", "name"), _PER_GPU_NAMES)
def test_per_gpu_recipe_equals_megatron_bridges(module: str, name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """``from megatron_bridge.recipes.<family>.<gpu> import <name>`` as from ``megatron.bridge.recipes...``; the
    values are the short name's (the same function) or the table's."""
    fn = getattr(importlib.import_module(f"megatron_bridge.recipes.{module}"), name)
    entry = PER_GPU[module][name]
    if isinstance(entry, str):
        assert fn is RECIPES[entry].fn, f"{name} is not {entry}'s recipe"
        return
    gpus = int(re.search(r"_(\d+)gpu_", name).group(1))
    ours = _values(fn, DIFFERENCES.get((name, "gpus"), gpus))
    expected = _expected(name, entry)
    assert {f: v for f, v in ours.items() if v != expected[f]} == {}, f"{name} differs from Megatron-Bridge"
    _validate(fn, ours["gpus"], module.split(".")[1], ours["low_precision"], monkeypatch)


@pytest.mark.parametrize("module", sorted(PER_GPU))
def test_per_gpu_modules_export_exactly_the_table(module: str) -> None:
    assert sorted(importlib.import_module(f"megatron_bridge.recipes.{module}").__all__) == sorted(PER_GPU[module])


def test_moe_recipes_validate_at_megatron_bridges_world_sizes() -> None:
    """Issue 44: Megatron-Bridge's MoE layouts where EP exceeds data × context parallelism (EP folded over the TP
    ranks) validate at its own world sizes, with its batch."""
    from megatron_bridge.recipes.qwen.h100 import (
        qwen3_30b_a3b_pretrain_8gpu_h100_bf16_config,
        qwen3_235b_a22b_pretrain_256gpu_h100_bf16_config,
    )

    small = qwen3_30b_a3b_pretrain_8gpu_h100_bf16_config()
    small.validate(world_size=8)
    assert small.data_parallel_size(8) == 1 and small.model.expert_model_parallel_size == 4
    big = qwen3_235b_a22b_pretrain_256gpu_h100_bf16_config()
    big.validate(world_size=256)
    assert big.data_parallel_size(256) == 2 and big.train.global_batch_size == 32
    assert "MoE parallel folding: with `expert_tensor_parallel_size=1` EP is carved out" not in DOC.read_text()


def test_megatron_bridge_import_path() -> None:
    from megatron_bridge.recipes.qwen import qwen3_30b_a3b_pretrain_config, qwen3_235b_a22b_pretrain_config

    assert qwen3_30b_a3b_pretrain_config is RECIPES["qwen3_30b_a3b"].fn
    assert qwen3_235b_a22b_pretrain_config is RECIPES["qwen3_235b_a22b"].fn
    from megatron_bridge.recipes.llama import (
        llama3_8b_low_precision_pretrain_config,
        llama3_70b_pretrain_deterministic_config,
        llama31_405b_pretrain_deterministic_config,
    )

    assert llama3_8b_low_precision_pretrain_config is RECIPES["llama3_8b_low_precision"].fn
    assert llama3_70b_pretrain_deterministic_config is RECIPES["llama3_70b_deterministic"].fn
    assert llama31_405b_pretrain_deterministic_config is RECIPES["llama31_405b_deterministic"].fn


# ------------------------------------------------------------------------------------------- flat perf recipes
PERF_REFUSED = {"expert_parallel_layout": "EP × ETP × PP larger than the world: megatron-core refuses these as well",
                "fp8_local_compat": "FP8 with Megatron FSDP on the native engine"}
"""Rules a perf config may fail here, each a row of docs/megatron-bridge-differences.md; NVFP4 ones also fail
``fp8_requirements`` (no torchao NVFP4 training recipe on the native engine). An MoE layout is refused only where
megatron-core's own ``initialize_model_parallel`` refuses it too (the world size not divisible by ETP × EP × PP: 7
Qwen3-235B-A22B configs at 64 GPUs with EP 32 and PP 4 or 8); EP folds over the TP × CP × DP ranks (issue 44)."""


def _launch_args(name: str) -> argparse.Namespace:
    recipe, gpu, dtype, gpus = perf_config_key(name)
    return build_parser().parse_args(["-mr", recipe, "-g", gpu, "-c", dtype, "-ng", str(gpus)])


def _env_digest(env: dict[str, object]) -> str:
    return hashlib.sha256(json.dumps({k: str(v) for k, v in env.items()}, sort_keys=True).encode()).hexdigest()[:12]


def test_every_megatron_bridge_perf_recipe_is_shipped() -> None:
    assert PERF_MB_COMMIT == MB_COMMIT == PERF_TABLES_COMMIT
    assert sorted(ROWS) == sorted(MB_PERF_VALUES)
    assert len(PERF_CONFIGS) == len(MB_PERF_VALUES)


@pytest.mark.parametrize("name", sorted(MB_PERF_VALUES))
def test_launched_perf_config_equals_megatron_bridges(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """``launch.py -mr <model> -g <gpu> -c <dtype> -ng <N>`` builds Megatron-Bridge's
    ``<model>_pretrain_<N>gpu_<gpu>_<dtype>_config``: layout, batch, sequence length, recompute, offloading, Megatron
    FSDP and environment; the config validates at N GPUs (mocked capability) or fails only documented rules."""
    import megatron_bridge.utils.packages as packages

    args = _launch_args(name)
    cfg = build_config(args)
    m = cfg.model
    recompute = (m.recompute_granularity, m.recompute_method, m.recompute_num_layers)
    ours = (m.tensor_model_parallel_size, m.pipeline_model_parallel_size, m.context_parallel_size,
            m.virtual_pipeline_model_parallel_size, m.expert_model_parallel_size, m.sequence_parallel,
            cfg.train.global_batch_size, cfg.train.micro_batch_size, m.seq_length,
            recompute if m.recompute_granularity else None,
            m.cpu_offloading_num_layers if m.cpu_offloading else None, cfg.dist.use_megatron_fsdp,
            _env_digest(environment(args, cfg)))
    expected = dict(zip(PERF_FIELDS, MB_PERF_VALUES[name], strict=True))
    assert {f: v for f, v in zip(PERF_FIELDS, ours, strict=True) if v != expected[f]} == {}, name
    assert cfg.mixed_precision.grad_reduce_in_fp32 is False
    monkeypatch.setattr(packages, "cuda_capability", lambda: CAPABILITY.get(args.gpu, (10, 0)))
    try:
        cfg.validate(world_size=args.num_gpus)
    except ConfigValidationError as exc:
        allowed = set(PERF_REFUSED) | ({"fp8_requirements"} if args.compute_dtype == "nvfp4" else set())
        rules = set(re.findall(r"\[rule (\w+)\]", str(exc)))
        assert rules <= allowed, exc
        if "expert_parallel_layout" in rules:  # megatron-core's initialize_model_parallel refuses it as well
            etp = m.expert_tensor_parallel_size or m.tensor_model_parallel_size
            assert args.num_gpus % (etp * m.expert_model_parallel_size * m.pipeline_model_parallel_size), name
    else:
        assert args.compute_dtype != "nvfp4", "NVFP4 has no torchao recipe: the native engine refuses it"


def test_launcher_picks_the_perf_recipe_as_megatron_bridge() -> None:
    """The one of exactly -ng GPUs; else Megatron-Bridge's default GPU count (its override table, else the largest)
    with the global batch weak-scaled by the data-parallel size; no perf recipe: the recipe itself."""
    assert get_perf_config("llama3_8b", "h100", "bf16", 64).num_gpus == 64
    assert get_perf_config("llama3_8b", "h100", "bf16", 16).num_gpus == 8  # override: 8, not the largest (64)
    assert get_perf_config("llama3_70b", "h100", "bf16", 32).num_gpus == 64  # the largest
    assert get_perf_config("qwen3_30b_a3b", "h100", "fp8_cs").num_gpus == 16
    assert get_perf_config("llama3_8b", "a100", "bf16") is None
    cfg = build_config(build_parser().parse_args(["-mr", "llama3_70b", "-g", "h100", "-ng", "128"]))
    assert cfg.train.global_batch_size == 256 * 2  # 64-GPU config at DP 2, run at DP 4
    assert build_config(build_parser().parse_args(["-mr", "llama3_70b", "-g", "h100", "-ng", "128", "-gb", "64"])
                        ).train.global_batch_size == 64
    cfg = build_config(build_parser().parse_args(["-mr", "llama3_8b", "-g", "a100", "-ng", "2"]))
    assert cfg.train.global_batch_size == 512  # the recipe's (no perf recipe for A100)


def test_perf_config_applies_its_pipeline_layout(monkeypatch: pytest.MonkeyPatch) -> None:
    """The one perf config with an explicit layout (Megatron-Bridge's llama3_70b H100 FP8 at 64 GPUs) sets it: 40
    stages over PP 8 × VP 5, three layers on stage 35, one on the last; it validates at 64 GPUs."""
    import megatron_bridge.utils.packages as packages
    from megatron_bridge.config.pipeline_layout import build_stage_specs

    with_layout = [key for key, config in PERF_CONFIGS.items() if config.pipeline_model_parallel_layout]
    assert with_layout == [("llama3_70b", "h100", "fp8_cs", 64)]
    cfg = build_config(_launch_args("llama3_70b_pretrain_64gpu_h100_fp8cs_config"))
    assert cfg.model.pipeline_model_parallel_layout == "Et*2|(t*2|)*34,t*3|(t*2|)*3,tL"
    monkeypatch.setattr(packages, "cuda_capability", lambda: CAPABILITY["h100"])
    cfg.validate(world_size=64)
    assert [len(s.layers) for s in build_stage_specs(cfg.model)] == [2] * 35 + [3, 2, 2, 2, 1]


def test_perf_differences_are_documented() -> None:
    text = DOC.read_text()
    for rule in PERF_REFUSED:
        assert f"`{rule}`" in text, rule
    assert "flat perf recipe" in text and "`flex` MoE dispatcher" in text


def test_per_gpu_names_import_from_the_recipes_package() -> None:
    """``from megatron.bridge.recipes import llama3_8b_pretrain_2gpu_h100_bf16_config`` works there (it star-imports
    every family's ``h100`` module, and ``recipes.qwen`` holds the GB200 name); the same line works here."""
    import megatron_bridge.recipes as recipes

    for module, names in PER_GPU.items():
        family = importlib.import_module(f"megatron_bridge.recipes.{module}")
        for name in names:
            assert getattr(recipes, name) is getattr(family, name), name
            assert name in recipes.__all__, name
    assert len(recipes.__all__) == len(set(recipes.__all__))
