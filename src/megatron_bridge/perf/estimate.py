"""Know before you launch: the dry-run table of per-rank memory, model FLOPs and step time on a named GPU.

``run_recipe.py --dry-run`` and ``launch.py --dryrun`` print :func:`dry_run_report` after the YAML, as YAML comments
(``# ...``), so the output stays loadable YAML. When the largest rank's estimate exceeds the GPU's memory the report
ends with a warning that names the knobs that would help, biggest part first. Pure arithmetic (no torch).
"""

from dataclasses import dataclass
from typing import TYPE_CHECKING

from megatron_bridge.config.gpus import GPU_MEMORY_GIB, find_gpu, known_gpus
from megatron_bridge.errors import ConfigValidationError
from megatron_bridge.models.flops import num_floating_point_operations
from megatron_bridge.perf.layout import Layout
from megatron_bridge.perf.memory import MemoryEstimate, estimate_memory
from megatron_bridge.perf.results import PEAK_TFLOPS


if TYPE_CHECKING:
    from megatron_bridge.config.container import ConfigContainer

DEFAULT_MFU = 0.40
"""MFU the step-time estimate assumes (a typical large-model figure; Megatron-Bridge's H100 Llama-3 8B runs reach
about 0.4-0.55)."""
HEADROOM = 0.90
"""Warn when the estimate exceeds this fraction of the GPU's memory (allocator fragmentation, CUDA context,
NCCL buffers)."""


def gpu_key(name: str | None) -> str:
    """Table key of a GPU name (``h100``, ``NVIDIA H100 80GB HBM3``: longest match); unknown names raise (for
    ``profiling.estimate_gpu`` rule ``profiling_settings`` names them in ``validate()``)."""
    key = find_gpu(name)
    if key is None:
        raise ConfigValidationError(f"unknown GPU {name!r} for the estimate; use one of {known_gpus()}",
                                    ("profiling.estimate_gpu",))
    return key


@dataclass(frozen=True)
class StepEstimate:
    """Model FLOPs of one optimizer step and the time it takes at ``mfu`` on ``world_size`` GPUs."""

    flops_per_step: float
    gpu: str
    peak_tflops: float
    mfu: float
    world_size: int

    @property
    def step_time_s(self) -> float:
        """Seconds per step at the assumed MFU."""
        return self.flops_per_step / (self.world_size * self.peak_tflops * 1e12 * self.mfu)


def estimate_step(cfg: "ConfigContainer", world_size: int, gpu: str | None = None,
                  mfu: float = DEFAULT_MFU) -> StepEstimate:
    """Model FLOPs per step (:func:`~megatron_bridge.models.flops.num_floating_point_operations` over the global
    batch) and the step time at ``mfu`` of the GPU's dense peak in the compute dtype."""
    key = gpu_key(gpu)
    mp = cfg.mixed_precision_config
    dtype = mp.compute_dtype if mp is not None else cfg.model.params_dtype
    flops = num_floating_point_operations(cfg.model, cfg.train.global_batch_size)
    return StepEstimate(flops, key, PEAK_TFLOPS[key][dtype], mfu, world_size)


def _gib(n: float) -> str:
    return f"{n / 2**30:10.3f}"


def _expert_grid(lay: Layout) -> list[str]:
    """With EP > 1, the folded expert groups of a stage: its tp × cp × dp ranks as etp × ep × edp."""
    if lay.ep <= 1:
        return []
    split = "each TP rank routes 1/TP of the tokens" if lay.splits_tokens_over_tp else "tokens replicated over TP"
    return [f"experts: the {lay.tp * lay.cp * lay.dp} tp x cp x dp ranks of a stage fold as etp {lay.etp} x ep "
            f"{lay.ep} x edp {lay.expert_shard_size} (expert state reduced over edp; {split})"]


def memory_table(est: MemoryEstimate) -> list[str]:
    """The per-rank memory rows (GiB)."""
    lay, acts = est.layout, est.activations
    shard = f"/{lay.shard_size}" if lay.backend != "ddp" else "replicated"
    rows = [
        f"layout: world {lay.world_size} = tp {lay.tp} x pp {lay.pp} x cp {lay.cp} x dp {lay.dp} (ep {lay.ep}, "
        f"vp {lay.vp}); backend {lay.backend}; {lay.num_microbatches} micro-batch(es) of {lay.micro_batch_size} x "
        f"{lay.seq_length} tokens",
        *_expert_grid(lay),
        f"parameters: {est.params.model_total / 1e6:.2f}M in the model, {est.params.total / 1e6:.2f}M on the largest "
        f"rank before data-parallel sharding ({shard})",
        f"{'per-rank memory (GiB)':44s} {'estimate':>10s}",
        f"{'  parameters':44s} {_gib(est.param_bytes)}",
        f"{'  gradients':44s} {_gib(est.grad_bytes)}",
        f"{'  optimizer state':44s} {_gib(est.optimizer_bytes)}",
        f"{'  activations (recompute ' + acts.recompute + f', {acts.in_flight:g} in flight)':44s} "
        f"{_gib(acts.peak_bytes)}",
        f"{'  buffers (buckets, all-gathers, casts)':44s} {_gib(est.buffer_bytes)}",
        f"{'  optimizer step temporaries':44s} {_gib(est.optimizer_step_bytes)}",
        f"{'  peak':44s} {_gib(est.peak_bytes)}",
        f"largest communication buffer: {est.largest_buffer[0]} {est.largest_buffer[1] / 2**20:.1f} MiB",
    ]
    if est.host_bytes:
        rows.append(f"host memory (offloaded): {est.host_bytes / 2**30:.3f} GiB")
    return rows + [f"note: {n}" for n in est.notes]


def knobs(cfg: "ConfigContainer", est: MemoryEstimate) -> list[str]:
    """Config changes that lower the largest part of the estimate, biggest part first."""
    lay = est.layout
    state = []
    if lay.backend == "ddp":
        state.append("dist.use_torch_fsdp2=true (shards parameters, gradients and optimizer state over dp)")
        if lay.dp * lay.cp > 1 and not cfg.optimizer.use_distributed_optimizer:  # kept equal to ddp's by validate()
            state.append("optimizer.use_distributed_optimizer=true (shards the optimizer state over dp, ZeRO-1)")
    elif lay.backend == "megatron_fsdp" and cfg.ddp.data_parallel_sharding_strategy != "optim_grads_params":
        state.append("ddp.data_parallel_sharding_strategy=optim_grads_params")
    state += ["more GPUs (a larger data-parallel size shards the state further)",
              "model.tensor_model_parallel_size / model.pipeline_model_parallel_size"]
    if lay.backend == "fsdp2" and cfg.fsdp2.offload_policy is None:
        state.append("fsdp2.offload_policy (state in host memory)")
    acts = []
    if est.activations.recompute in ("none", "mlp"):
        acts.append("model.recompute_granularity=selective or full")
    if lay.micro_batch_size > 1:
        acts.append("a smaller train.micro_batch_size")
    if lay.tp > 1 and not lay.sequence_parallel:
        acts.append("model.sequence_parallel=true")
    acts += ["model.context_parallel_size (splits the sequence)", "model.cpu_offloading"]
    ordered = [state, acts] if est.state_bytes >= est.activations.peak_bytes else [acts, state]
    return [k for group in ordered for k in group]


def dry_run_report(cfg: "ConfigContainer", world_size: int, gpu: str | None = None) -> str:
    """The dry-run table as YAML comment lines: memory per rank, FLOPs and time per step, and a capacity warning."""
    gpu = gpu or getattr(cfg.profiling, "estimate_gpu", None)
    est = estimate_memory(cfg, world_size)
    step = estimate_step(cfg, world_size, gpu)
    capacity = GPU_MEMORY_GIB[step.gpu] * 2**30
    rows = ["memory and FLOPs estimate (megatron_bridge.perf.estimate; docs/performance.md)", *memory_table(est),
            f"model FLOPs per step: {step.flops_per_step:.4g} "
            f"({step.flops_per_step / cfg.train.global_batch_size / cfg.model.seq_length:.4g} per token)",
            f"on {step.gpu} ({GPU_MEMORY_GIB[step.gpu]:g} GiB, {step.peak_tflops:g} TFLOP/s dense): "
            f"{step.step_time_s * 1000:.1f} ms/step at {step.mfu:.0%} MFU"]
    if est.peak_bytes > HEADROOM * capacity:
        rows.append(f"WARNING: the largest rank needs ~{est.peak_bytes / 2**30:.1f} GiB, more than "
                    f"{HEADROOM:.0%} of the {step.gpu}'s {GPU_MEMORY_GIB[step.gpu]:g} GiB. Knobs that help:")
        rows += [f"  - {k}" for k in knobs(cfg, est)]
    return "\n".join(f"# {r}" for r in rows) + "\n"
