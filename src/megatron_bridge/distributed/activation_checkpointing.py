"""Activation checkpointing of decoder blocks: full, selective (PyTorch SAC) and MLP-only.

Every knob ends in :func:`apply_activation_checkpointing`, which the DDP and FSDP2 backends call before wrapping:

* ``ddp.activation_checkpointing`` / ``fsdp2.activation_checkpointing``: ``True``/``"full"`` wraps each decoder
  block in a non-reentrant ``checkpoint_wrapper`` (only the block input is kept; the block is recomputed in
  backward). ``"selective"`` uses ``torch.utils.checkpoint.create_selective_checkpoint_contexts`` with the
  torchtitan/AutoModel policy: compute-intensive ops (matmuls, SDPA) are saved, every second ``mm``/``linear``
  is recomputed, everything else (norms, activations, RoPE) is recomputed.
* ``*.activation_checkpointing_scope``: ``["all"]`` and ``["language"]`` select the decoder blocks of this library's
  models (their trainable ones); the other scopes (vision, audio, multimodal) match nothing here and are logged.
* ``fsdp2.mlp_activation_checkpointing``: checkpoint only each block's MLP.
* ``model.recompute_granularity`` ("full" / "selective") with ``model.recompute_method="block"`` and
  ``model.recompute_num_layers=n`` (only the first ``n`` blocks): the Megatron-style knobs, mapped here.
  ``recompute_method="uniform"`` (or None) checkpoints every block individually.
"""

import functools
from collections import defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import torch
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
    CheckpointImpl,
    CheckpointWrapper,
    checkpoint_wrapper,
)
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

from megatron_bridge.config.rule_set import enforce
from megatron_bridge.distributed.common import BlockRef, find_decoder_blocks, has_trainable_params, unwrap_checkpoint
from megatron_bridge.utils.logging import get_logger, log_rank_0, warn_once


if TYPE_CHECKING:
    from megatron_bridge.config.container import ConfigContainer

logger = get_logger(__name__)

ACMode = bool | Literal["full", "selective"] | None
LANGUAGE_SCOPES = frozenset({"all", "language"})
MLP_ATTRIBUTES = ("mlp", "feed_forward", "ffn")


@dataclass(frozen=True)
class ACSettings:
    """Resolved activation-checkpointing request of a backend."""

    mode: Literal["full", "selective"] | None
    """None: no checkpointing."""
    scope: tuple[str, ...] = ("all",)
    """Layer groups to checkpoint."""
    mlp_only: bool = False
    """Checkpoint only the MLP of each selected block."""
    max_blocks: int | None = None
    """Checkpoint only the first ``max_blocks`` selected blocks (Megatron's recompute_method="block")."""
    source: str = ""
    """Config path the request came from (for logs)."""


def normalize_mode(mode: ACMode, path: str = "activation_checkpointing") -> Literal["full", "selective"] | None:
    """``False``/None → None, ``True``/``"full"`` → ``"full"``, ``"selective"`` → ``"selective"``."""
    if mode is None or mode is False:
        return None
    if mode is True or mode == "full":
        return "full"
    if mode == "selective":
        return "selective"
    raise ValueError(f"{path}={mode!r} is not an activation-checkpointing mode (rule field_types): use False, True, "
                     "'full' or 'selective'")


def ac_settings(cfg: "ConfigContainer", section: Literal["ddp", "fsdp2"]) -> ACSettings:
    """The activation-checkpointing request of the ``ddp`` or ``fsdp2`` section, or of ``model.recompute_*``.

    Raises:
        ConfigValidationError: ``recompute_method="block"`` without 0 <= ``recompute_num_layers`` <= num_layers
            (rule ``recompute_settings``).
    """
    m = cfg.model
    if m.recompute_granularity is not None:
        mode = normalize_mode(m.recompute_granularity, "model.recompute_granularity")
        max_blocks = None
        if mode == "full" and m.recompute_method == "block":
            enforce(cfg, "recompute_settings")
            max_blocks = m.recompute_num_layers
        return ACSettings(mode, ("all",), False, max_blocks, "model.recompute_granularity")
    options = getattr(cfg, section)
    path = f"{section}.activation_checkpointing"
    mode = normalize_mode(options.activation_checkpointing, path)
    mlp_only = section == "fsdp2" and cfg.fsdp2.mlp_activation_checkpointing
    if mlp_only and mode is not None:
        warn_once(logger, "mlp_ac_redundant", "fsdp2.mlp_activation_checkpointing=True is redundant with %s=%r: "
                  "whole blocks are checkpointed", path, options.activation_checkpointing)
        mlp_only = False
    if mlp_only:
        mode, path = "full", "fsdp2.mlp_activation_checkpointing"
    return ACSettings(mode, tuple(options.activation_checkpointing_scope), mlp_only, None, path)


# ------------------------------------------------------------------------------------------- selective policy
def _resolve_ops(names: tuple[str, ...]) -> set[Any]:
    ops = set()
    for name in names:
        packet = getattr(torch.ops.aten, name, None)
        if packet is not None:
            ops.add(packet)
    return ops


def _compute_intensive_ops() -> set[Any]:
    try:
        from torch._functorch.partitioners import get_default_op_list

        default = set(get_default_op_list().compute_intensive_ops)
    except (ImportError, AttributeError):
        default = set()
    return default | _resolve_ops((
        "mm", "addmm", "bmm", "baddbmm", "linear", "_scaled_mm", "scaled_dot_product_attention",
        "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention_for_cpu",
        "_fused_attention_overrideable", "_flash_attention_forward", "_efficient_attention_forward",
    ))


ALTERNATING_OPS = frozenset(_resolve_ops(("mm", "linear", "_grouped_mm", "_scaled_grouped_mm")))
"""Matmuls saved and recomputed in turn (odd occurrences saved), as torchtitan's selective policy."""


@functools.cache
def must_save_ops() -> frozenset[Any]:
    """Compute-intensive ops whose outputs are always saved (attention, batched/fused matmuls).

    Computed on first use: torch's default op list lives in ``torch._functorch.partitioners``, whose import pulls in
    torch._dynamo and torch._inductor (~2.5 CPU seconds), paid otherwise by every process importing this module."""
    return frozenset(_compute_intensive_ops() - ALTERNATING_OPS)


def _selective_policy() -> Any:
    counts: dict[bool, int] = defaultdict(int)
    must_save = must_save_ops()

    def policy(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
        packet = getattr(op, "overloadpacket", op)
        if packet in ALTERNATING_OPS:
            counts[ctx.is_recompute] += 1  # forward and recompute each count from 0
            odd = counts[ctx.is_recompute] % 2 == 1
            return CheckpointPolicy.MUST_SAVE if odd else CheckpointPolicy.PREFER_RECOMPUTE
        if packet in must_save:
            return CheckpointPolicy.MUST_SAVE
        return CheckpointPolicy.PREFER_RECOMPUTE

    return policy


def selective_checkpoint_context() -> Any:
    """A fresh pair of SAC contexts (``context_fn`` of a checkpointed block), with its own matmul counter."""
    return create_selective_checkpoint_contexts(_selective_policy())


# ------------------------------------------------------------------------------------------------- application
def wrap_for_checkpointing(module: nn.Module, mode: Literal["full", "selective"]) -> nn.Module:
    """``module`` in a non-reentrant checkpoint wrapper (with the selective policy for ``"selective"``)."""
    kwargs: dict[str, Any] = {"checkpoint_impl": CheckpointImpl.NO_REENTRANT}
    if mode == "selective":
        kwargs["context_fn"] = selective_checkpoint_context
    return checkpoint_wrapper(module, **kwargs)


def select_blocks(model: nn.Module, scope: tuple[str, ...] | list[str]) -> list[BlockRef]:
    """The trainable decoder blocks the scope selects ("all"/"language": every one; other scopes: none here)."""
    if not LANGUAGE_SCOPES.intersection(scope):
        warn_once(logger, f"ac_scope:{tuple(scope)}", "activation_checkpointing_scope=%s selects no layers of %s (it "
                  "has only language decoder blocks): nothing is checkpointed", list(scope), type(model).__name__)
        return []
    return [ref for ref in find_decoder_blocks(model) if has_trainable_params(ref.module)]


def _mlp_ref(block: nn.Module) -> BlockRef | None:
    inner = unwrap_checkpoint(block)
    for name in MLP_ATTRIBUTES:
        child = getattr(inner, name, None)
        if isinstance(child, nn.Module):
            return BlockRef(inner, name, child)
    return None


def apply_activation_checkpointing(
    model: nn.Module,
    mode: ACMode,
    scope: tuple[str, ...] | list[str] = ("all",),
    mlp_only: bool = False,
    max_blocks: int | None = None,
) -> int:
    """Wrap the selected decoder blocks (or their MLPs) of ``model`` in place; returns how many were wrapped.

    Args:
        model: the model (its blocks are found through ``_no_split_modules``).
        mode: False/None (nothing), True/"full" or "selective".
        scope: layer groups; "all"/"language" select the trainable decoder blocks, other groups none.
        mlp_only: checkpoint each selected block's ``mlp`` (or ``feed_forward``/``ffn``) instead of the block.
        max_blocks: only the first ``max_blocks`` selected blocks.
    Already wrapped modules are left as they are (idempotent).
    """
    resolved = normalize_mode(mode)
    if resolved is None:
        return 0
    refs = select_blocks(model, scope)
    if max_blocks is not None:
        refs = refs[:max_blocks]
    if mlp_only:
        refs = [r for r in (_mlp_ref(ref.module) for ref in refs) if r is not None]
    wrapped = 0
    for ref in refs:
        if isinstance(ref.module, CheckpointWrapper):
            continue
        ref.replace(wrap_for_checkpointing(ref.module, resolved))
        wrapped += 1
    what = "MLPs" if mlp_only else "blocks"
    log_rank_0(logger, "Activation checkpointing (%s): wrapped %d decoder %s", resolved, wrapped, what)
    return wrapped


def apply_ac_settings(model: nn.Module, settings: ACSettings) -> int:
    """:func:`apply_activation_checkpointing` with resolved :class:`ACSettings`."""
    return apply_activation_checkpointing(model, settings.mode, settings.scope, settings.mlp_only, settings.max_blocks)
