"""The memory model of the megatron-core engine (megatron-core DDP + ``get_megatron_optimizer``) against hand counts
(pure arithmetic, no torch); measured against megatron-core itself in
tests/functional_tests/perf/test_mcore_memory_estimate.py."""

from typing import Any

from megatron_bridge.config.container import ConfigContainer
from megatron_bridge.perf.estimate import dry_run_report
from megatron_bridge.perf.memory import estimate_memory
from megatron_bridge.recipes import tiny_llama_pretrain_config


N = 836_736
"""Parameters of the tiny recipe (test_memory_estimate.py counts them by hand)."""


def _mcore(world_size: int, **fields: Any) -> ConfigContainer:
    cfg = tiny_llama_pretrain_config()
    cfg.model.engine = "megatron_core"
    for path, value in fields.items():
        section, name = path.split("__")
        setattr(getattr(cfg, section) if section != "cfg" else cfg, name, value)
    return cfg.validate(world_size=world_size)


def test_bf16_dp2_without_distributed_optimizer_hand_count() -> None:
    """bf16 weights (Float16Module) 2 B, fp32 main_grad buffer 4 B, fp32 main parameters + two moments 12 B, all
    replicated; no DDP buckets or autocast copies beside them, no fp32 gradient copy in the step."""
    cfg = _mcore(2, cfg__mixed_precision="bf16_mixed")
    est = estimate_memory(cfg, 2)
    assert est.params.total == N and est.layout.dp == 2
    assert (cfg.model.params_dtype, cfg.ddp.grad_reduce_in_fp32) == ("bfloat16", True)
    assert (est.param_bytes, est.grad_bytes, est.optimizer_bytes) == (2 * N, 4 * N, 12 * N)
    assert est.buffer_bytes == est.persistent_buffer_bytes == est.optimizer_step_bytes == 0
    assert est.largest_buffer == ("megatron-core DDP gradient bucket", 4 * N)
    assert est.peak_bytes == 18 * N + est.activations.peak_bytes
    assert any("megatron-core DDP: weights 2 B/param" in n and "replicated" in n for n in est.notes)


def test_bf16_dp2_distributed_optimizer_hand_count() -> None:
    """The distributed optimizer shards the 12 B of optimizer state over DP = 2; weights and gradients stay whole."""
    est = estimate_memory(_mcore(2, cfg__mixed_precision="bf16_mixed", optimizer__use_distributed_optimizer=True), 2)
    assert (est.param_bytes, est.grad_bytes, est.optimizer_bytes) == (2 * N, 4 * N, 12 * N // 2)
    assert any("sharded over 2 data-parallel rank(s)" in n for n in est.notes)
    assert not any("ZeroRedundancyOptimizer" in n for n in est.notes)  # the native engine's ZeRO-1 note


def test_bf16_grads_in_bf16_count_the_steps_fp32_gradient_copy() -> None:
    """ddp.grad_reduce_in_fp32=False: a bf16 gradient buffer, and the step's fp32 copy of the local main gradients."""
    cfg = _mcore(2, cfg__mixed_precision=None, optimizer__bf16=True, model__params_dtype="bfloat16",
                 ddp__grad_reduce_in_fp32=False, optimizer__use_distributed_optimizer=True)
    assert cfg.optimizer.use_distributed_optimizer and not cfg.ddp.grad_reduce_in_fp32
    est = estimate_memory(cfg, 2)
    assert (est.grad_bytes, est.optimizer_step_bytes) == (2 * N, 4 * N // 2)


def test_fp32_dp2_distributed_optimizer_hand_count() -> None:
    """fp32: no main copies (the optimizer steps on the weights), moments sharded over DP."""
    cfg = _mcore(2, cfg__mixed_precision="fp32", optimizer__use_distributed_optimizer=True)
    est = estimate_memory(cfg, 2)
    assert (est.param_bytes, est.grad_bytes, est.optimizer_bytes) == (4 * N, 4 * N, 8 * N // 2)
    assert est.optimizer_step_bytes == 0 and est.peak_bytes == 12 * N + est.activations.peak_bytes


def test_native_engine_estimate_is_unchanged() -> None:
    """The same bf16 layout on the native engine keeps its formulas (fp32 parameters, DDP buckets, autocast)."""
    cfg = tiny_llama_pretrain_config()
    cfg.mixed_precision = "bf16_mixed"
    est = estimate_memory(cfg.validate(world_size=2), 2)
    assert (est.param_bytes, est.grad_bytes, est.optimizer_bytes) == (4 * N, 4 * N, 8 * N)
    assert not any("megatron_core" in n for n in est.notes)


def test_fsdp2_wrapper_bf16_dp2_hand_count() -> None:
    """megatron-core's FSDP2 wrapper: bf16 weights and bf16 gradients (no MixedPrecisionPolicy, so
    ddp.grad_reduce_in_fp32 has no effect), fp32 main parameters + moments, all sharded over DP = 2; the step's fp32
    copy of the local bf16 gradients."""
    cfg = _mcore(2, cfg__mixed_precision="bf16_mixed", dist__use_torch_fsdp2=True)
    assert cfg.ddp.grad_reduce_in_fp32
    est = estimate_memory(cfg, 2)
    assert (est.param_bytes, est.grad_bytes, est.optimizer_bytes) == (2 * N // 2, 2 * N // 2, 12 * N // 2)
    assert est.optimizer_step_bytes == 4 * N // 2
    assert any("FSDP2 wrapper" in n and "sharded over 2 rank(s)" in n for n in est.notes)


def test_megatron_fsdp_adapter_keeps_the_megatron_fsdp_formulas_with_a_note() -> None:
    """megatron-core's Megatron FSDP adapter is counted with megatron-fsdp's formulas (the native engine's Megatron
    FSDP backend uses the same library), and the note says so."""
    cfg = _mcore(2, cfg__mixed_precision="bf16_mixed", dist__use_megatron_fsdp=True,
                 ddp__data_parallel_sharding_strategy="optim_grads_params")
    est = estimate_memory(cfg, 2)
    assert (est.param_bytes, est.grad_bytes, est.optimizer_bytes) == (2 * N // 2, 4 * N // 2, 12 * N // 2)
    report = dry_run_report(cfg, 2)
    assert "# note: model.engine=megatron_core with the Megatron FSDP adapter: megatron-fsdp's formulas" in report


def test_the_estimate_asks_the_engine_for_its_memory_model() -> None:
    """The factory hands the megatron-core engine's model to perf/memory.py and none for the native engine, whose
    formulas are the estimate's own; neither the factory nor the estimate imports torch."""
    import subprocess
    import sys

    from megatron_bridge.engines.factory import engine_memory
    from megatron_bridge.engines.megatron_core.memory import MegatronCoreMemory

    assert engine_memory(tiny_llama_pretrain_config()) is None
    assert isinstance(engine_memory(_mcore(2)), MegatronCoreMemory)
    code = ("import sys, megatron_bridge.engines.factory, megatron_bridge.perf.memory; "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
