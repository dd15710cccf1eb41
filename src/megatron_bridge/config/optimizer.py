"""``cfg.optimizer`` and ``cfg.scheduler``: the optimizer and its learning-rate / weight-decay schedule."""

from dataclasses import dataclass
from typing import Literal

from megatron_bridge.config.declared import DeclaredFields


@dataclass(kw_only=True)
class OptimizerConfig(DeclaredFields):
    """AdamW or SGD from torch, with gradient clipping."""

    optimizer: Literal["adam", "sgd"] = "adam"
    """"adam" is AdamW (decoupled weight decay); "sgd" is SGD with momentum."""
    lr: float = 3e-4
    """Peak learning rate."""
    min_lr: float = 0.0
    """Learning rate at the end of the decay."""
    weight_decay: float = 0.01
    """Weight decay of matrices (norm weights and biases never decay)."""
    adam_beta1: float = 0.9
    """Adam first-moment coefficient."""
    adam_beta2: float = 0.999
    """Adam second-moment coefficient."""
    adam_eps: float = 1e-8
    """Adam epsilon."""
    sgd_momentum: float = 0.9
    """SGD momentum."""
    clip_grad: float = 1.0
    """Clip the global gradient norm to this value; 0 disables clipping (the norm is still logged)."""
    use_distributed_optimizer: bool = False
    """Shard optimizer state over data-parallel ranks (ZeRO-1). FSDP2 and Megatron FSDP always do. Differs from
    Megatron-Bridge with DDP: torch's ZeroRedundancyOptimizer (each rank updates ~1/DP of the parameters and
    broadcasts them), while Megatron's distributed optimizer also reduce-scatters the gradients DDP all-reduces."""
    bf16: bool = False
    """The model computes in bfloat16 (set by the mixed-precision preset)."""
    fp16: bool = False
    """The model computes in float16 with loss scaling (set by the mixed-precision preset)."""
    loss_scale: float | None = None
    """Static loss scale for fp16; None uses dynamic loss scaling."""
    initial_loss_scale: float = 2.0**16
    """Initial dynamic loss scale for fp16."""
    implementation: Literal["auto", "fused", "foreach", "for_loop"] = "auto"
    """torch optimizer kernel: "auto" picks fused on CUDA and foreach elsewhere."""


@dataclass(kw_only=True)
class SchedulerConfig(DeclaredFields):
    """Learning-rate warmup and decay, and the weight-decay schedule (all in optimizer steps)."""

    lr_warmup_iters: int = 0
    """Linear warmup steps from lr_warmup_init to optimizer.lr."""
    lr_warmup_fraction: float | None = None
    """Warmup as a fraction of lr_decay_iters; excludes lr_warmup_iters."""
    lr_warmup_init: float = 0.0
    """Learning rate at step 0 of the warmup."""
    lr_decay_iters: int | None = None
    """Steps over which the learning rate decays to min_lr; None means train.train_iters."""
    lr_decay_style: Literal["constant", "linear", "cosine", "inverse-square-root", "WSD"] = "cosine"
    """Shape of the decay after warmup."""
    lr_wsd_decay_style: Literal["exponential", "linear", "cosine", "minus_sqrt"] = "exponential"
    """With lr_decay_style="WSD": shape of the final decay phase."""
    lr_wsd_decay_iters: int | None = None
    """With lr_decay_style="WSD": steps of the final decay phase (the rest after warmup is stable)."""
    start_weight_decay: float | None = None
    """Weight decay at step 0; None means optimizer.weight_decay."""
    end_weight_decay: float | None = None
    """Weight decay at lr_decay_iters; None means optimizer.weight_decay."""
    weight_decay_incr_style: Literal["constant", "linear", "cosine"] = "constant"
    """How weight decay moves from start_weight_decay to end_weight_decay."""
    override_opt_param_scheduler: bool = False
    """On resume, take the schedule constants (lr, min_lr, warmup, decay, weight decay) from this config instead of
    the checkpoint. With neither this nor use_checkpoint_opt_param_scheduler, they must agree (as in Megatron)."""
    use_checkpoint_opt_param_scheduler: bool = False
    """On resume, take the schedule constants from the checkpoint (excludes override_opt_param_scheduler)."""
