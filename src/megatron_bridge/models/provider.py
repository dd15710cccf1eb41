"""Turns a :class:`ModelConfig` into model chunks, and materializes models built on the meta device."""

import torch
from torch import nn

from megatron_bridge.config.model import ModelConfig
from megatron_bridge.config.rules_engine import require_native_engine
from megatron_bridge.models.llama import LlamaModel
from megatron_bridge.models.validation import check_model_buildable
from megatron_bridge.utils.logging import get_logger, log_rank_0


logger = get_logger(__name__)


def build_model_chunks(
    config: ModelConfig, *, device: torch.device | str | None = None, pp_rank: int = 0
) -> list[nn.Module]:
    """Build the model chunks this rank holds: one :class:`LlamaModel`, or with pipeline parallelism
    (``model.pipeline_model_parallel_size > 1``) the stage modules of pipeline rank ``pp_rank``, one per virtual
    stage (:mod:`megatron_bridge.models.pipeline_stage`).

    Tensor parallelism and data-parallel sharding are applied afterwards by the distributed layer to the full model
    built here. With ``config.init_model_with_meta_device`` the model is built on the meta device, uninitialized;
    the wrapper materializes it with :func:`materialize_meta_model` (``to_empty`` + ``init_weights``).

    Args:
        config: the model config.
        device: where to build when not on the meta device; None means torch's current default device.

    Raises:
        ConfigValidationError: ``config.engine`` is not "native", or a model rule of ``validate()`` fails
            (:mod:`megatron_bridge.config.rules_model`):
            a layout the engine does not build, an impossible pipeline split, an engine that is not installed or
            wired, or fields that cannot form a model.
    """
    require_native_engine(config, "build_model_chunks")
    check_model_buildable(config)  # the model rules of validate(), for callers that skipped it
    if config.pipeline_model_parallel_size > 1:
        from megatron_bridge.models.pipeline_stage import build_pipeline_chunks

        return list(build_pipeline_chunks(config, pp_rank, device=device))
    build_device = torch.device("meta") if config.init_model_with_meta_device else device
    model = LlamaModel(config, device=build_device)
    log_rank_0(
        logger,
        "Built LlamaModel: %d layers, hidden %d, %s parameters, dtype %s, device %s",
        config.num_layers,
        config.hidden_size,
        f"{sum(p.numel() for p in model.parameters()):,}",
        config.params_dtype,
        model.embed_tokens.weight.device,
    )
    return [model]


def _init_topmost(module: nn.Module) -> None:
    """Call ``init_weights`` on ``module`` if it has one, else on the topmost descendants that do (each once)."""
    init = getattr(module, "init_weights", None)
    if callable(init):
        init()
        return
    for child in module.children():
        _init_topmost(child)


def materialize_meta_model(module: nn.Module, device: torch.device | str) -> nn.Module:
    """Allocate a meta-device model on ``device`` and initialize it in place; returns ``module``.

    Runs ``module.to_empty(device=device)``, then ``init_weights()`` on the module, or (for a wrapper without one)
    on every topmost submodule that has it, then ``tie_weights()`` on every submodule that has it (``to_empty``
    unties shared parameters). With the same torch seed the weights are bitwise those of a direct build on
    ``device``.
    """
    module.to_empty(device=device)
    _init_topmost(module)
    for sub in module.modules():
        tie = getattr(sub, "tie_weights", None)
        if callable(tie):
            tie()
    return module
