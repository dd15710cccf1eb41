"""Per-rank memory model of a validated config: parameters, gradients, optimizer state, activations, buffers.

Pure arithmetic on the config (no torch), for the largest rank of the layout. The formulas follow what this library
allocates (DDP, FSDP2 and Megatron FSDP backends, the local engine) and Megatron's rules for the layout:

* **Parameters per rank**: matrices and the vocabulary-parallel embedding/output divide by TP, norms are replicated;
  under PP each pipeline rank holds its layers as the engine splits them (even, first/last-stage sizes, embedding
  and loss counted as layers, an explicit ``pipeline_model_parallel_layout``, virtual stages;
  :func:`~megatron_bridge.perf.layout.pipeline_ranks`), the embedding with the first stage and the output layer,
  final norm (and, when tied, an embedding copy) with the last; experts divide by EP and the expert TP size. Every
  pipeline rank is estimated; the table shows the largest.
* **State bytes per parameter** (``model.params_dtype`` = P bytes; torch optimizers keep state in the parameter
  dtype): parameters P, gradients P, AdamW 2P (SGD with momentum P). FSDP2 shards all three over dp × cp (with
  EP > 1 the experts over the expert-data-parallel group, dp × cp × tp / (EP × ETP)) and
  ``fsdp2.offload_policy`` moves them to host memory; Megatron FSDP shards them by
  ``ddp.data_parallel_sharding_strategy`` (optim → optimizer, optim_grads → + gradients,
  optim_grads_params → + parameters), gradients in fp32 with ``ddp.grad_reduce_in_fp32``, plus fp32 main weights
  when parameters are 16-bit. DDP shards only optimizer state, with ``optimizer.use_distributed_optimizer`` (ZeRO-1).
  The megatron-core engine under megatron-core DDP or its FSDP2 wrapper counts megatron-core's state instead
  (:mod:`megatron_bridge.engines.megatron_core.memory`, asked through ``engine_memory(cfg)``: compute-dtype
  weights, the contiguous ``main_grad`` buffer, fp32 main parameters and moments); under its Megatron FSDP adapter the
  Megatron FSDP formulas above (a note says so).
* **Activations**: :mod:`megatron_bridge.perf.activations`.
* **Buffers**: communication and cast copies that are neither state nor activations (:func:`buffer_bytes`): DDP's
  flat gradient buckets (P per parameter, unless ``ddp.gradient_as_bucket_view``) for the whole run, the rest
  during forward/backward.
* **Peak** = state + max(activations + buffers, the optimizer step's temporaries (one copy of the local optimizer
  parameters: AdamW's foreach ``sqrt(exp_avg_sq)``) + the persistent buffers).

Measured against this library on CPU by ``scripts/performance/scaling.py`` (errors in docs/performance.md).
"""

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from megatron_bridge.engines.factory import engine_memory
from megatron_bridge.engines.memory import DTYPE_BYTES, EngineMemory, fp32_optimizer_bytes, optimizer_moments
from megatron_bridge.models.flops import parameter_breakdown
from megatron_bridge.perf.activations import ActivationEstimate, estimate_activations
from megatron_bridge.perf.layout import Layout, RankStages, cfg_get, layout_of, pipeline_ranks


if TYPE_CHECKING:
    from megatron_bridge.config.container import ConfigContainer


@dataclass(frozen=True)
class RankParams:
    """Parameters held by one rank (before data-parallel sharding), and the whole model's count."""

    dense: int
    """Parameters replicated over expert-parallel ranks (everything but the experts), after TP/PP."""
    expert: int
    """Expert parameters on this rank, after EP, expert TP and PP."""
    embedding_and_output: int
    """Of ``dense``: the embedding/output layer rows on this rank (FSDP2 keeps them in the root unit)."""
    input_embedding: int
    """Of ``embedding_and_output``: an untied input embedding (read by lookup, never cast by autocast)."""
    block: int
    """One decoder block's parameters on this rank (an FSDP unit)."""
    model_total: int
    """Every parameter of the model."""

    @property
    def total(self) -> int:
        """Parameters on this rank."""
        return self.dense + self.expert


@dataclass
class MemoryEstimate:
    """Estimated bytes on the largest rank; ``notes`` say what was assumed."""

    layout: Layout
    params: RankParams
    param_bytes: int
    grad_bytes: int
    optimizer_bytes: int
    activations: ActivationEstimate
    buffer_bytes: int
    """Communication and cast buffers (see :func:`buffer_bytes`), persistent ones included."""
    persistent_buffer_bytes: int
    """Of ``buffer_bytes``: allocated for the whole run (DDP's gradient buckets)."""
    optimizer_step_bytes: int
    """Temporaries of the optimizer step (outside the forward/backward peak)."""
    largest_buffer: tuple[str, int]
    """The largest single communication buffer: (what, bytes)."""
    host_bytes: int = 0
    """Bytes moved to host memory by offloading (not counted in the device total)."""
    notes: list[str] = field(default_factory=list)
    pp_rank: int = 0
    """The pipeline rank this estimate is for (the largest one)."""

    @property
    def state_bytes(self) -> int:
        """Parameters + gradients + optimizer state: what stays allocated between steps."""
        return self.param_bytes + self.grad_bytes + self.optimizer_bytes

    @property
    def peak_bytes(self) -> int:
        """Estimated peak of the rank."""
        step = self.optimizer_step_bytes + self.persistent_buffer_bytes
        return self.state_bytes + max(self.activations.peak_bytes + self.buffer_bytes, step)


def _moe_layers(cfg: "ConfigContainer", layers: "int | tuple[int, ...]") -> int:
    """MoE layers among ``layers`` (global indices; an int: the first that many)."""
    if not cfg_get(cfg.model, "num_moe_experts", 0):
        return 0
    indices = range(layers) if isinstance(layers, int) else layers
    freq = cfg_get(cfg.model, "moe_layer_freq", 1)
    if isinstance(freq, list | tuple):
        return sum(1 for i in indices if i < len(freq) and freq[i])
    return sum(1 for i in indices if i % max(1, int(freq)) == 0)


def _expert_params(cfg: "ConfigContainer") -> tuple[int, int]:
    """(all routed experts of one MoE layer, router + shared expert of one MoE layer)."""
    m = cfg.model
    experts = int(cfg_get(m, "num_moe_experts", 0))
    h = m.hidden_size
    n_fc1 = 2 if m.gated_linear_unit else 1
    fe = int(cfg_get(m, "moe_ffn_hidden_size", m.ffn_hidden_size))
    fs = int(cfg_get(m, "moe_shared_expert_intermediate_size", 0))
    return experts * (n_fc1 + 1) * h * fe, h * experts + (n_fc1 + 1) * h * fs


def rank_params(cfg: "ConfigContainer", layout: Layout, rank: RankStages | None = None) -> RankParams:
    """Parameters on pipeline rank ``rank`` (default: the first)."""
    parts = parameter_breakdown(cfg.model)
    rank = rank or pipeline_ranks(cfg, layout)[0]
    tp, moe_total, moe_dense = layout.tp, *_expert_params(cfg)
    attn = (parts.layer_attention - parts.layer_attention_norms) // tp + parts.layer_attention_norms
    dense_mlp = parts.layer_mlp // tp
    n_layers, n_moe = len(rank.layers), _moe_layers(cfg, rank.layers)
    lookup = parts.embedding // tp if rank.first and parts.output else 0
    edge = parts.embedding // tp if rank.first else 0
    if rank.last:
        edge += (parts.output or (parts.embedding if layout.pp > 1 else 0)) // tp
    dense = n_layers * attn + (n_layers - n_moe) * dense_mlp + n_moe * moe_dense + edge
    dense += parts.final_norm if rank.last else 0
    expert = n_moe * moe_total // (layout.ep * layout.etp)
    model_total = parts.total + _moe_layers(cfg, parts.num_layers) * (moe_total + moe_dense - parts.layer_mlp)
    depths = int(cfg_get(cfg.model, "mtp_num_layers", 0) or 0)  # MTP: the last rank's, each a layer like the last
    if depths and rank.last:
        last_moe = _moe_layers(cfg, (parts.num_layers - 1,)) > 0
        eh_proj, norms = 2 * cfg.model.hidden_size ** 2, 3 * parts.final_norm
        dense += depths * (attn + (moe_dense if last_moe else dense_mlp) + norms + eh_proj // tp)
        expert += depths * (moe_total // (layout.ep * layout.etp) if last_moe else 0)
        model_total += depths * (parts.layer_attention + (moe_total + moe_dense if last_moe else parts.layer_mlp)
                                 + norms + eh_proj)
    return RankParams(dense, expert, edge, lookup, attn + dense_mlp, model_total)


def _engine_state(cfg: "ConfigContainer", layout: Layout) -> EngineMemory | None:
    """The engine's memory model where it replaces the native state formulas (``counts_state``), else None."""
    model = engine_memory(cfg)
    return model if model is not None and model.counts_state(cfg, layout) else None


def _gradient_buffer(cfg: "ConfigContainer", layout: Layout) -> EngineMemory | None:
    """The engine's memory model where its contiguous gradient buffer replaces DDP's buckets, else None."""
    model = engine_memory(cfg)
    return model if model is not None and model.has_gradient_buffer(cfg, layout) else None


def _bytes_per_param(cfg: "ConfigContainer", layout: Layout) -> tuple[int, int, int]:
    """(parameter, gradient, optimizer-state) bytes per parameter before sharding."""
    model = _engine_state(cfg, layout)
    if model is not None:
        return model.bytes_per_param(cfg, layout)
    pbytes = DTYPE_BYTES[cfg.model.params_dtype]
    if cfg.dist.use_megatron_fsdp:  # fp32 moments, fp32 main weights for 16-bit parameters
        return pbytes, 4 if cfg.ddp.grad_reduce_in_fp32 else pbytes, fp32_optimizer_bytes(cfg)
    return pbytes, pbytes, optimizer_moments(cfg) * pbytes


def _sharded(cfg: "ConfigContainer", layout: Layout) -> tuple[bool, bool, bool]:
    """Whether (parameters, gradients, optimizer state) are sharded over data-parallel ranks."""
    if layout.backend == "fsdp2":
        return True, True, True
    if layout.backend == "megatron_fsdp":
        s = cfg.ddp.data_parallel_sharding_strategy
        return s == "optim_grads_params", s in ("optim_grads", "optim_grads_params"), s != "no_shard"
    native = engine_memory(cfg) is None  # megatron-core's distributed optimizer shards under every layout
    zero = cfg.optimizer.use_distributed_optimizer and (not native or (layout.pp == 1 and layout.tp == 1))
    return False, False, zero  # DDP: ZeRO-1 shards optimizer state only (native engine: not under PP or TP)


def state_bytes(cfg: "ConfigContainer", layout: Layout, params: RankParams) -> tuple[int, int, int]:
    """Per-rank (parameter, gradient, optimizer) bytes, sharded as the backend shards them."""
    per_param = _bytes_per_param(cfg, layout)
    out = []
    # experts shard over the expert-data-parallel group (FSDP2: one unit per MoE layer's experts on the "edp" mesh,
    # distributed/fsdp2_sharding.py; whole when edp is 1)
    for nbytes, sharded in zip(per_param, _sharded(cfg, layout), strict=True):
        dense = params.dense // layout.shard_size if sharded else params.dense
        expert = params.expert // layout.expert_shard_size if sharded else params.expert
        out.append(nbytes * (dense + expert))
    return out[0], out[1], out[2]


def ddp_bucket_bytes(cfg: "ConfigContainer", layout: Layout, params: RankParams) -> int:
    """DDP's flat gradient buckets (allocated at wrap time, kept for the whole run), beside ``param.grad`` unless
    ``ddp.gradient_as_bucket_view``. megatron-core DDP has none beside its gradient buffer (counted as gradients)."""
    if layout.backend != "ddp" or cfg.ddp.gradient_as_bucket_view or _gradient_buffer(cfg, layout):
        return 0
    return _bytes_per_param(cfg, layout)[1] * params.total


def compute_bytes(cfg: "ConfigContainer") -> int:
    """Bytes of the compute dtype (the mixed-precision preset's, else the parameter dtype)."""
    mp = cfg.mixed_precision_config
    return DTYPE_BYTES[mp.compute_dtype] if mp is not None and (mp.bf16 or mp.fp16) else DTYPE_BYTES[
        cfg.model.params_dtype]


def _fsdp2_buffers(cfg: "ConfigContainer", layout: Layout, params: RankParams, n_layers: int
                   ) -> tuple[int, tuple[str, int]]:
    """Unsharded root (embedding, output, norm) + gathered blocks in the param dtype, one block's unsharded grads
    and reduce-scatter input in the reduce dtype. Under PP ``reshard_after_forward=None`` means False (the FSDP2
    backend keeps a stage's blocks gathered between its micro-batches)."""
    policy = cfg.fsdp2.mp_policy
    gather = DTYPE_BYTES.get(getattr(policy, "param_dtype", None) or "", compute_bytes(cfg))
    reduce = DTYPE_BYTES.get(getattr(policy, "reduce_dtype", None) or "", 4)
    first_n = n_layers
    reshard = cfg.fsdp2.reshard_after_forward
    if reshard is None and layout.pp > 1:
        reshard = False
    depth = cfg.fsdp2.fsdp2_backward_prefetch_depth if cfg.fsdp2.enable_fsdp2_prefetch else 0
    held = first_n if reshard is False else min(first_n, 1 + depth + (1 if reshard is None else 0))
    root = params.embedding_and_output * gather
    block = params.block * gather
    name = "Megatron FSDP" if layout.backend == "megatron_fsdp" else "FSDP2"
    return root + held * block + 2 * params.block * reduce, (f"{name} all-gather (largest unit)", max(root, block))


def buffer_bytes(cfg: "ConfigContainer", layout: Layout, params: RankParams, n_layers: int | None = None
                 ) -> tuple[int, tuple[str, int]]:
    """Transient buffers of the forward/backward and the largest single communication buffer.

    DDP: its flat gradient buckets (:func:`ddp_bucket_bytes`) and, with a bf16/fp16 preset, autocast's cast copies
    of the weights (kept for backward). FSDP2 / Megatron FSDP: the all-gathered parameters of the units in use and one
    block's unsharded gradients. PP: send/receive buffers of one micro-batch's hidden states. SP / CP: the gathered
    sequence / keys and values (in the activations).
    """
    cbytes, pbytes = compute_bytes(cfg), DTYPE_BYTES[cfg.model.params_dtype]
    hidden = layout.tokens_per_microbatch * cfg.model.hidden_size * cbytes
    total, largest = 0, ("none", 0)
    grad_buffer = _gradient_buffer(cfg, layout)
    if grad_buffer is not None:  # weights already in the compute dtype; buckets are views of the gradient buffer
        largest = ("megatron-core DDP gradient bucket", grad_buffer.bucket_bytes(cfg, layout, params.total))
    elif layout.backend == "ddp":
        total += ddp_bucket_bytes(cfg, layout, params)
        if cbytes < pbytes:
            total += (params.total - params.input_embedding) * cbytes  # the embedding lookup is not autocast
        bucket = int((cfg.ddp.bucket_cap_mb or 25) * 2**20)
        largest = ("DDP gradient bucket", min(bucket, params.total * pbytes))
    else:  # FSDP2 (also with offloading: units are gathered to the device) and Megatron FSDP
        n = cfg.model.num_layers if n_layers is None else n_layers
        total, largest = _fsdp2_buffers(cfg, layout, params, n)
    if layout.pp > 1:
        total += 2 * hidden
        largest = max(largest, ("PP send/recv (one micro-batch)", hidden), key=lambda x: x[1])
    if layout.sequence_parallel:
        largest = max(largest, ("SP all-gather of the hidden states", hidden), key=lambda x: x[1])
    if layout.cp > 1:
        m = cfg.model
        kv = 2 * layout.micro_batch_size * layout.seq_length * m.num_kv_heads * m.head_dim // layout.tp * cbytes
        largest = max(largest, ("CP all-gather of keys and values", kv), key=lambda x: x[1])
    return total, largest


def estimate_memory(cfg: "ConfigContainer", world_size: int) -> MemoryEstimate:
    """The per-rank memory estimate of ``cfg`` on ``world_size`` processes (call after ``cfg.validate()``): every
    pipeline rank is estimated, the one with the largest peak is returned (``pp_rank`` says which)."""
    layout = layout_of(cfg, world_size)
    ranks = [_estimate_rank(cfg, layout, rank) for rank in pipeline_ranks(cfg, layout)]
    return max(ranks, key=lambda e: e.peak_bytes)


def _estimate_rank(cfg: "ConfigContainer", layout: Layout, rank: RankStages) -> MemoryEstimate:
    params = rank_params(cfg, layout, rank)
    p, g, o = state_bytes(cfg, layout, params)
    notes: list[str] = []
    host = 0
    if layout.backend == "fsdp2" and cfg.fsdp2.offload_policy is not None:
        host, p, g, o = p + g + o, 0, 0, 0
        notes.append("fsdp2.offload_policy: sharded parameters, gradients and optimizer state live in host memory")
    if layout.backend == "ddp" and cfg.optimizer.use_distributed_optimizer and not _gradient_buffer(cfg, layout):
        notes.append("optimizer.use_distributed_optimizer with DDP: ZeRO-1, optimizer state sharded over "
                     "data-parallel ranks (ZeroRedundancyOptimizer)" if _sharded(cfg, layout)[2] else
                     "optimizer.use_distributed_optimizer with DDP under PP or TP: the optimizer state stays "
                     "replicated (distributed/ddp.py); dist.use_torch_fsdp2=true shards it")
    acts = estimate_activations(cfg, layout, rank)
    host += acts.host_bytes
    buffers, largest = buffer_bytes(cfg, layout, params, len(rank.layers))
    opt_params = o // max(1, _bytes_per_param(cfg, layout)[2]) if o else 0
    step_tmp = opt_params * DTYPE_BYTES[cfg.model.params_dtype] if cfg.optimizer.optimizer == "adam" else 0
    model = engine_memory(cfg)
    notes.extend(model.notes(cfg, layout) if model is not None else [])  # none for the native engine
    state = _engine_state(cfg, layout)
    if state is not None:
        step_tmp = state.step_temporary_bytes(cfg, layout, opt_params)
    notes.extend(acts.notes)
    if layout.pp > 1:
        notes.append(f"pipeline rank {rank.pp_rank} of {layout.pp} is the largest: {len(rank.layers)} layers in "
                     f"{rank.chunks} chunk(s){', the embedding' if rank.first else ''}"
                     f"{', the output layer' if rank.last else ''}; {layout.pipeline_schedule} keeps "
                     f"{acts.in_flight:g} of its layer stacks' activations alive")
    persistent = ddp_bucket_bytes(cfg, layout, params)
    return MemoryEstimate(layout, params, p, g, o, acts, buffers, persistent, step_tmp, largest, host, notes,
                          rank.pp_rank)
