"""``cfg.checkpoint``: where and how checkpoints are saved and loaded."""

from dataclasses import dataclass
from typing import Literal

from megatron_bridge.config.declared import DeclaredFields


CkptFormat = Literal["torch_dist", "fsdp_dtensor", "torch"]


@dataclass(kw_only=True)
class CheckpointConfig(DeclaredFields):
    """Checkpoint save/load (torch.distributed.checkpoint for the sharded formats)."""

    save: str | None = None
    """Folder to save checkpoints to; None disables saving."""
    load: str | None = None
    """Folder to resume from; an empty or missing folder starts fresh (and says so)."""
    save_interval: int | None = None
    """Save every this many steps (and at the end); None saves only at the end."""
    most_recent_k: int = -1
    """Keep only the newest k checkpoints; -1 keeps all."""
    ckpt_format: CkptFormat = "torch_dist"
    """"torch_dist" (sharded DCP, DDP path), "fsdp_dtensor" (DTensor shards, FSDP backends) or "torch" (one file).
    With model.engine='megatron_core', "torch_dist" is megatron-core's distributed checkpoint exactly as
    Megatron-LM and Megatron-Bridge write it (the folders load across the libraries; docs/training/checkpointing.md).
    Differs from Megatron-Bridge for the native engine: there "torch_dist" is PyTorch DCP keyed by this library's
    parameter names (convert with scripts/checkpoint/convert.py), and "fsdp_dtensor" also works with FSDP2
    (Megatron-Bridge: Megatron FSDP only)."""
    fully_parallel_save: bool = True
    """model.engine='megatron_core': spread the writing of replicated tensors over the data-parallel ranks
    (megatron-core's FullyParallelSaveStrategyWrapper), as Megatron-Bridge does by default. The native engine's
    DCP planner always de-duplicates replicas."""
    dist_ckpt_optim_fully_reshardable: bool = False
    """model.engine='megatron_core' with the distributed optimizer: save its state "fully_reshardable" (loads at any
    TP/PP/DP) instead of "dp_reshardable" (loads at another DP size only), as in Megatron-Bridge."""
    async_save: bool = False
    """Write checkpoints in the background while training goes on (torch_dist and fsdp_dtensor only)."""
    save_optim: bool = True
    """Save optimizer and LR-scheduler state."""
    save_rng: bool = True
    """Save RNG states (per rank)."""
    load_optim: bool = True
    """Restore optimizer and LR-scheduler state when resuming."""
    load_rng: bool = True
    """Restore RNG states when resuming."""
    finetune: bool = False
    """Load model weights only and start at step 0 (no optimizer, scheduler, RNG or train state)."""
    pretrained_checkpoint: str | None = None
    """Weights to start from when `load` has no checkpoint (loaded as with finetune)."""
    ckpt_step: int | None = None
    """Load this step instead of the latest one."""
    exit_on_missing_checkpoint: bool = False
    """Fail instead of starting fresh when `load` is set but holds no checkpoint."""
    overwrite: bool = False
    """Allow saving into a `save` folder that holds checkpoints this run did not resume from (another run's, or
    steps after the resumed one): they are deleted before training, with a warning. False makes that a named error.
    Not a Megatron-Bridge field."""
