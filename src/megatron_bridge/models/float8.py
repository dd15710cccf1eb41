"""FP8 training of the local engine through torchao (``mixed_precision`` FP8 presets; docs/training/low-precision.md).

Set-up converts the plain model chunks before ``ddp_wrap``, as torchtitan does, so tensor parallelism, activation
checkpointing and FSDP2 then see the converted layers:

* ``fp8_recipe='tensorwise'`` → ``torchao.float8.convert_to_float8_training``: the selected ``nn.Linear`` become
  ``Float8Linear`` (parameter names, shapes and checkpoints unchanged); ``fp8='hybrid'`` casts gradients to E5M2,
  ``fp8='e4m3'`` everything to E4M3. Under FSDP2, ``fp8_param_gather`` → ``enable_fsdp_float8_all_gather`` (the
  shards are cast to FP8 before the all-gather) and :meth:`Float8Training.after_optimizer_step` calls
  ``precompute_float8_dynamic_scale_for_fsdp`` after every optimizer step, as torchao documents.
* ``fp8_recipe='mxfp8'`` → ``torchao.quantization.quantize_`` with ``MXFP8TrainingOpConfig`` (recipe
  ``mxfp8_rceil``): the selected Linear weights become MXFP8 training tensors; FSDP2 gathers them in bf16.

Which Linear layers (:func:`fp8_module_filter`, torchao's and torchtitan's filter): not the output layer
(``lm_head``; the embedding is not a Linear), both dims multiples of 16 (32 for MXFP8), and with
``first_last_layers_bf16`` none of the first ``num_layers_at_start_in_bf16`` / last ``num_layers_at_end_in_bf16``
decoder layers. ``validate()`` refuses what this cannot run (rule ``fp8_requirements``).
"""

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from torch import nn

from megatron_bridge.config.fp8_local import FP8_BLOCK_SIZE, TORCHAO_RECIPES
from megatron_bridge.config.mixed_precision import MixedPrecisionConfig
from megatron_bridge.config.rule_set import enforce
from megatron_bridge.utils.logging import get_logger, log_rank_0


if TYPE_CHECKING:
    from megatron_bridge.config.container import ConfigContainer

logger = get_logger(__name__)

MARKER_PREFIX = "_megatron_bridge_"
"""Attributes the model sets on its layers; conversion carries them over to the new modules."""
OUTPUT_LAYER_NAMES = ("lm_head",)
"""Linear layers never converted (torchtitan's ``filter_fqns=["output"]``): the logits stay in high precision."""


def bf16_layer_indices(mp: MixedPrecisionConfig, num_layers: int) -> set[int]:
    """Global indices of the decoder layers kept out of FP8 (``first_last_layers_bf16``)."""
    if not mp.first_last_layers_bf16:
        return set()
    start, end = mp.num_layers_at_start_in_bf16, mp.num_layers_at_end_in_bf16
    return set(range(start)) | set(range(num_layers - end, num_layers))


def _linears_in_layers(model: nn.Module, layer_indices: set[int]) -> set[int]:
    """``id`` of every Linear inside a decoder layer (a module with ``layer_idx``) whose index is listed."""
    ids: set[int] = set()
    for module in model.modules():
        if getattr(module, "layer_idx", None) in layer_indices:
            ids.update(id(m) for m in module.modules() if isinstance(m, nn.Linear))
    return ids


def fp8_module_filter(model: nn.Module, mp: MixedPrecisionConfig, num_layers: int) -> Callable[[nn.Module, str], bool]:
    """The ``module_filter_fn(module, fqn)`` torchao calls for each Linear of ``model`` (module docstring)."""
    block = FP8_BLOCK_SIZE[mp.fp8_recipe]
    kept_high = _linears_in_layers(model, bf16_layer_indices(mp, num_layers))

    def keep(module: nn.Module, fqn: str) -> bool:
        if not isinstance(module, nn.Linear) or id(module) in kept_high:
            return False
        if fqn.rsplit(".", 1)[-1] in OUTPUT_LAYER_NAMES:
            return False
        out_features, in_features = module.weight.shape
        return out_features % block == 0 and in_features % block == 0

    return keep


def float8_linear_config(mp: MixedPrecisionConfig, *, fsdp_float8_all_gather: bool, emulate: bool = False) -> Any:
    """torchao's ``Float8LinearConfig`` for the tensorwise recipe: ``fp8='hybrid'`` → E4M3 inputs and weights, E5M2
    gradients (torchao's default); ``fp8='e4m3'`` → E4M3 gradients too. ``emulate`` runs the GEMMs in high precision
    (torchao's test mode)."""
    import torch
    from torchao.float8 import CastConfig, Float8LinearConfig

    grad_dtype = torch.float8_e5m2 if mp.fp8 == "hybrid" else torch.float8_e4m3fn
    return Float8LinearConfig(cast_config_grad_output=CastConfig(target_dtype=grad_dtype),
                              enable_fsdp_float8_all_gather=fsdp_float8_all_gather, emulate=emulate)


def mxfp8_training_config(*, emulate: bool = False) -> Any:
    """torchao's ``MXFP8TrainingOpConfig`` for ``fp8_recipe='mxfp8'`` (``mxfp8_rceil``; emulated on request)."""
    from torchao.prototype.moe_training.config import MXFP8TrainingOpConfig, MXFP8TrainingRecipe

    recipe = MXFP8TrainingRecipe.MXFP8_EMULATED_RCEIL if emulate else MXFP8TrainingRecipe.MXFP8_RCEIL
    return MXFP8TrainingOpConfig.from_recipe(recipe)


@dataclass
class Float8Training:
    """What the conversion did, and the per-step work it needs."""

    recipe: str
    """The ``fp8_recipe`` converted for ("tensorwise" or "mxfp8")."""
    converted: list[str] = field(default_factory=list)
    """Qualified names of the converted Linear layers (over all chunks)."""
    precompute_scales: bool = False
    """FSDP2 float8 all-gather: compute the weights' FP8 scales in one all-reduce after each optimizer step."""

    def after_optimizer_step(self, chunks: list[nn.Module]) -> None:
        """``precompute_float8_dynamic_scale_for_fsdp`` on every chunk when :attr:`precompute_scales`."""
        if not self.precompute_scales:
            return
        from torchao.float8 import precompute_float8_dynamic_scale_for_fsdp

        for chunk in chunks:
            precompute_float8_dynamic_scale_for_fsdp(chunk)


def _converted_names(model: nn.Module, keep: Callable[[nn.Module, str], bool]) -> list[str]:
    return [name for name, module in model.named_modules() if keep(module, name)]


def convert_chunk(model: nn.Module, mp: MixedPrecisionConfig, num_layers: int, *, fsdp_float8_all_gather: bool,
                  emulate: bool = False) -> list[str]:
    """Convert ``model``'s selected Linear layers in place for ``mp.fp8_recipe``; returns their names."""
    if mp.fp8_recipe not in TORCHAO_RECIPES:  # mixed_precision.fp8_recipe: rule fp8_requirements
        raise ValueError(f"fp8_recipe={mp.fp8_recipe!r} has no torchao training recipe: use one of "
                         f"{sorted(TORCHAO_RECIPES)}")
    keep = fp8_module_filter(model, mp, num_layers)
    names = _converted_names(model, keep)
    markers = {n: _own_markers(model.get_submodule(n)) for n in names}
    if mp.fp8_recipe == "tensorwise":
        from torchao.float8 import convert_to_float8_training

        config = float8_linear_config(mp, fsdp_float8_all_gather=fsdp_float8_all_gather, emulate=emulate)
        convert_to_float8_training(model, module_filter_fn=keep, config=config)
    else:
        from torchao.quantization import quantize_

        quantize_(model, mxfp8_training_config(emulate=emulate), filter_fn=keep)
    for name, attrs in markers.items():  # Float8Linear is a new module: keep our markers (init_weights reads them)
        for key, value in attrs.items():
            setattr(model.get_submodule(name), key, value)
    return names


def _own_markers(module: nn.Module) -> dict[str, Any]:
    """The library's attributes on a layer (``_megatron_bridge_*``, e.g. the output-projection init marker)."""
    return {k: v for k, v in vars(module).items() if k.startswith(MARKER_PREFIX)}


def convert_for_fp8_training(chunks: list[nn.Module], cfg: "ConfigContainer") -> Float8Training | None:
    """Convert the chunks for the FP8 preset of ``cfg.mixed_precision`` (None when it asks for no FP8)."""
    mp = cfg.mixed_precision
    if not isinstance(mp, MixedPrecisionConfig) or not mp.fp8:
        return None
    enforce(cfg, "fp8_fp4_settings", "fp8_requirements", "fp8_local_compat")
    fsdp2 = cfg.dist.use_torch_fsdp2
    all_gather = bool(mp.fp8_param_gather and fsdp2 and mp.fp8_recipe == "tensorwise")
    result = Float8Training(recipe=mp.fp8_recipe, precompute_scales=all_gather)
    for chunk in chunks:
        result.converted += convert_chunk(chunk, mp, cfg.model.num_layers, fsdp_float8_all_gather=all_gather,
                                          emulate=mp.fp8_emulate)
    log_rank_0(logger, "FP8 (%s): %d Linear layers converted%s; fp8_param_gather=%s → %s",
               TORCHAO_RECIPES[mp.fp8_recipe].split(":")[0], len(result.converted),
               f", layers {sorted(bf16_layer_indices(mp, cfg.model.num_layers))} kept in bf16"
               if mp.first_last_layers_bf16 else "", mp.fp8_param_gather,
               "FSDP2 all-gathers FP8 weights" if all_gather else "weights gathered in their param dtype")
    return result
