"""``cfg.dist``, ``cfg.ddp`` and ``cfg.fsdp2``: process groups and the data-parallel backend with its options.

Backend selection: ``dist.use_megatron_fsdp`` → Megatron FSDP, ``dist.use_torch_fsdp2`` → PyTorch FSDP2, else DDP.
The option → backend → effect table is in docs/training/distributed-backends.md.
"""

from dataclasses import dataclass, field
from typing import Literal

from megatron_bridge.config.declared import DeclaredFields
from megatron_bridge.config.model import DType


ShardingStrategy = Literal["no_shard", "optim", "optim_grads", "optim_grads_params"]
ActivationCheckpointing = bool | Literal["full", "selective"]


@dataclass(kw_only=True)
class DistributedInitConfig(DeclaredFields):
    """How processes find each other and which data-parallel backend wraps the model."""

    distributed_backend: Literal["nccl", "gloo"] | None = None
    """Process-group backend; None picks nccl when CUDA is available and gloo otherwise."""
    distributed_timeout_minutes: int = 10
    """Timeout of collectives, in minutes: a collective that waits longer for another rank fails the job."""
    distributed_timeout_seconds: int | None = None
    """Timeout of collectives in seconds; overrides distributed_timeout_minutes when set (short timeouts in tests,
    fast failure of hung jobs). Not a Megatron-Bridge field."""
    use_megatron_fsdp: bool = False
    """Wrap the model with Megatron FSDP (the megatron-fsdp package). Cannot be used together with use_torch_fsdp2."""
    use_torch_fsdp2: bool = False
    """Wrap the model with PyTorch FSDP2 (fully_shard). Cannot be used together with use_megatron_fsdp. Differs from
    Megatron-Bridge: tensor parallelism (TP > 1) runs on this backend (recipes with TP set it)."""


@dataclass(kw_only=True)
class DistributedDataParallelConfig(DeclaredFields):
    """Options of the DDP backend and of Megatron FSDP (the ``ddp`` section, as in Megatron-Bridge)."""

    # Shared Megatron-style options.
    grad_reduce_in_fp32: bool = False
    """Reduce gradients in fp32 if True (Megatron FSDP). Differs from Megatron-Bridge: torch DDP reduces in the
    gradient dtype, which is fp32 here (master weights stay fp32); FSDP2 uses fsdp2.mp_policy.reduce_dtype."""
    overlap_grad_reduce: bool = False
    """Overlap gradient reduction with backward compute if True."""
    overlap_param_gather: bool = False
    """Overlap parameter all-gather with forward compute if True (Megatron FSDP / distributed optimizer)."""
    use_distributed_optimizer: bool = False
    """Shard optimizer state over data-parallel ranks (ZeRO-1 with DDP); kept equal to
    optimizer.use_distributed_optimizer."""
    check_for_nan_in_grad: bool = False
    """DDP/FSDP2: fail with a named error when the gradient norm is NaN/Inf. Megatron FSDP (megatron-fsdp>=0.5):
    legacy no-op kept for config compatibility, dropped with a one-time warning; use report_nan_in_param_grad."""
    report_nan_in_param_grad: bool = False
    """Megatron FSDP: precise per-parameter gradient NaN check (replacement of check_for_nan_in_grad; slow)."""
    bucket_size: int | None = None
    """Megatron FSDP: communication bucket size in elements (suggested_communication_unit_size); None: default.
    Differs from Megatron-Bridge: torch DDP ignores it (its bucket size is ddp.bucket_cap_mb, in MiB)."""
    average_in_collective: bool = False
    """Average gradients inside the collective (instead of dividing before it) if True. Differs from
    Megatron-Bridge: torch DDP always averages (same gradients either way); Megatron FSDP sets it False (logged)."""
    use_megatron_fsdp: bool = False
    """Megatron FSDP is on; kept equal to dist.use_megatron_fsdp by validate()."""
    data_parallel_sharding_strategy: ShardingStrategy = "no_shard"
    """Megatron FSDP sharding: no_shard (DDP-like), optim (ZeRO-1), optim_grads (ZeRO-2), optim_grads_params (ZeRO-3)
    (Megatron-Bridge recipes set it even without FSDP; it only takes effect with Megatron FSDP)."""
    keep_fp8_transpose_cache: bool = False
    """Megatron FSDP: keep the fp8 transpose cache between steps if True."""
    nccl_ub: bool = False
    """Megatron FSDP: use NCCL user buffers if True (CUDA only)."""
    fsdp_double_buffer: bool = False
    """Megatron FSDP: use double buffers for parameter all-gather if True."""
    disable_bucketing: bool = False
    """Megatron FSDP: disable bucketing of communication if True."""
    preserve_fp32_weights: bool = False
    """Megatron FSDP: keep fp32 main weights (mixed precision master copy) if True."""
    calculate_per_token_loss: bool = False
    """Megatron FSDP: gradients are scaled for a per-token loss (no division by the number of micro-batches)."""
    megatron_fsdp_unit_modules: list[str] | None = None
    """Megatron FSDP: class paths of the submodules wrapped as FSDP units; None derives them from the model's
    _no_split_modules (the real block classes)."""
    megatron_fsdp_mlp_activation_checkpointing: bool = False
    """Megatron FSDP: activation checkpointing of the transformer MLP layers to save memory."""

    # Options of the torch DistributedDataParallel backend.
    broadcast_buffers: bool = False
    """DDP: synchronize module buffers before each forward."""
    bucket_cap_mb: float | None = None
    """DDP: gradient bucket size in MiB; None uses PyTorch's default (25)."""
    find_unused_parameters: bool = False
    """DDP: forwarded to PyTorch DDP for models with conditionally unused trainable parameters."""
    gradient_as_bucket_view: bool = False
    """DDP: make gradients views into DDP buckets after the first iteration."""
    static_graph: bool = False
    """DDP: tell DDP the used/unused parameter set is stable."""
    activation_checkpointing: ActivationCheckpointing = False
    """DDP: True or "full" checkpoints whole transformer blocks; "selective" uses PyTorch selective checkpointing."""
    activation_checkpointing_scope: list[str] = field(default_factory=lambda: ["all"])
    """DDP: layer groups to checkpoint: ["all"] or named groups ("language", "vision", ...) filtered to trainable
    layers."""
    autocast_dtype: DType | None = None
    """DDP: wrap the forward in torch.autocast with this dtype (e.g. "bfloat16"); None autocasts to the
    mixed-precision preset's compute dtype (bf16_mixed/fp16_mixed) and not at all with fp32."""


@dataclass(kw_only=True)
class FSDP2MixedPrecisionPolicy(DeclaredFields):
    """torch.distributed.fsdp.MixedPrecisionPolicy as config (YAML may also use the seed's ``_target_`` form)."""

    param_dtype: DType | None = "bfloat16"
    """Dtype parameters are all-gathered and computed in; None keeps the storage dtype."""
    reduce_dtype: DType | None = "float32"
    """Dtype of the gradient reduce-scatter; None uses param_dtype."""
    output_dtype: DType | None = "bfloat16"
    """Dtype the root module casts its outputs to; None leaves them."""
    cast_forward_inputs: bool = True
    """Cast floating-point forward inputs to param_dtype."""


@dataclass(kw_only=True)
class FSDP2OffloadPolicy(DeclaredFields):
    """torch.distributed.fsdp.CPUOffloadPolicy as config."""

    pin_memory: bool = False
    """Pin the CPU copies of parameters; needs an accelerator (it fails without one), so the default is False."""


@dataclass(kw_only=True)
class FSDP2Config(DeclaredFields):
    """Options of the PyTorch FSDP2 (fully_shard) backend."""

    mp_policy: FSDP2MixedPrecisionPolicy | None = None
    """MixedPrecisionPolicy; None follows the mixed-precision preset: bf16_mixed → bf16 compute with fp32 gradient
    reduction (Megatron-style fp32 master weights), fp16_mixed → the same in fp16, fp32 → everything fp32 (logged)."""
    offload_policy: FSDP2OffloadPolicy | None = None
    """CPUOffloadPolicy: keep sharded parameters, gradients and optimizer state in CPU memory; None disables."""
    autocast_dtype: DType | None = None
    """Wrap the forward in torch.autocast with this dtype; use with mp_policy.output_dtype="float32" to keep the
    residual stream in fp32 while matmuls run in lower precision. None disables autocast."""
    activation_checkpointing: ActivationCheckpointing = False
    """True or "full" checkpoints whole transformer blocks; "selective" uses PyTorch selective checkpointing."""
    activation_checkpointing_scope: list[str] = field(default_factory=lambda: ["all"])
    """Layer groups to checkpoint: ["all"] or named groups ("language", ...) filtered to trainable layers."""
    mlp_activation_checkpointing: bool = False
    """Checkpoint only the MLP of each transformer block (the MLP-only variant)."""
    defer_fsdp_grad_sync: bool = True
    """Defer gradient reduce-scatter to the last micro-batch of a step (set_requires_gradient_sync)."""
    reshard_after_forward: bool | None = None
    """None: every block reshards after forward except the last; True/False forces it for every block."""
    enable_fsdp2_prefetch: bool = True
    """Explicit forward/backward prefetch chains between blocks."""
    fsdp2_forward_prefetch_depth: int = 1
    """Blocks prefetched during forward."""
    fsdp2_backward_prefetch_depth: int = 2
    """Blocks prefetched during backward: 2 hides all-gather behind compute, 1 lowers peak memory."""
    enable_compile: bool = False
    """torch.compile each decoder block separately (non-reentrant checkpointing inside); no whole-model compile,
    so checkpoint keys never get _orig_mod. prefixes."""
    enable_async_tensor_parallel: bool = False
    """Async tensor parallelism (torch._inductor micro-pipeline TP); requires model.sequence_parallel (enabled with a
    warning when missing) and enable_compile."""
    tp_plan: dict[str, str] | None = None
    """Custom TP plan: module-name pattern → "colwise" | "rowwise" | "sequence_parallel" | "replicate"; None
    auto-selects the Llama plan."""
    patch_is_packed_sequence: bool = False
    """Hugging Face models only: patch transformers' _is_packed_sequence to return False (removes a host sync per
    attention layer). A no-op, with a log line, for this library's own models."""
    frozen_module_policy: Literal["root", "per_layer", "replicate"] = "root"
    """Fully frozen modules: kept in the always-run root unit ("root"), sharded in their own units ("per_layer",
    every rank must run them identically) or replicated outside FSDP ("replicate")."""
