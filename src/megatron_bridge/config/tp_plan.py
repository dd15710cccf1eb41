"""A custom ``fsdp2.tp_plan`` checked against the native model's module names, without building the model.

The rule ``tp_plan_matches_model`` (``validate()``) needs to know which modules the native model has for a
:class:`~megatron_bridge.config.model.ModelConfig`; :func:`megatron_bridge.config.decoder_names.native_module_names`
lists them from the config alone (torch-free, the config floor). Applying a plan to a real model is
:mod:`megatron_bridge.distributed.tensor_parallel`, which refuses the same plans with the same messages.
"""

from fnmatch import fnmatchcase
from typing import TYPE_CHECKING

from megatron_bridge.config import decoder_names as n
from megatron_bridge.config.decoder_names import native_module_names
from megatron_bridge.errors import ConfigValidationError


if TYPE_CHECKING:
    from megatron_bridge.config.model import ModelConfig

def match_patterns(names: list[str], patterns: dict[str, str], model_name: str = "LlamaModel") -> dict[str, str]:
    """Module name → the pattern that matches it (``fnmatch``; the first matching pattern wins), for every module a
    pattern matches.

    Raises:
        ConfigValidationError: the plan matches no module.
    """
    matched = {}
    for name in names:
        pattern = next((p for p in patterns if name and fnmatchcase(name, p)), None)
        if pattern is not None:
            matched[name] = pattern
    if not matched:
        raise ConfigValidationError(
            f"fsdp2.tp_plan={patterns!r} matches no module of {model_name}: patterns are matched with "
            f"fnmatch against fully qualified names such as {n.attention('*') + '.' + n.Q_PROJ!r}.", ("fsdp2.tp_plan",),
        )
    return matched


def check_attention_split(attention: str, styles: dict[str, str | None], heads: dict[str, int], tp: int) -> bool:
    """Whether an attention module (``styles`` of its projections, ``decoder_names.PROJECTIONS``) is split over TP;
    it must be split whole, and its head counts (``heads``: ``num_heads``, ``num_kv_heads``) must divide by ``tp``.

    Raises:
        ConfigValidationError: the attention is split partly, or a head count does not divide by ``tp``.
    """
    if "colwise" not in styles.values():
        return False
    if not (all(styles[p] == "colwise" for p in n.QKV) and styles[n.O_PROJ] == "rowwise"):
        raise ConfigValidationError(
            f"fsdp2.tp_plan shards {attention} partly: {', '.join(n.QKV[:2])} and {n.QKV[2]} must all be 'colwise' "
            f"and {n.O_PROJ} 'rowwise' (heads are split over the TP group), or none of them sharded.",
            ("fsdp2.tp_plan",),
        )
    for attr, value in heads.items():
        if value % tp:
            raise ConfigValidationError(
                f"{attention}.{attr}={value} is not divisible by model.tensor_model_parallel_size={tp}.",
                ("model.tensor_model_parallel_size",),
            )
    return True


def check_custom_plan(cfg: "ModelConfig", patterns: dict[str, str]) -> None:
    """Resolve ``fsdp2.tp_plan`` against the native model's module names and check every attention's split, as
    applying the plan will (rule ``tp_plan_matches_model`` of ``validate()``).

    Raises:
        ConfigValidationError: the plan matches no module, shards an attention partly, or heads do not divide by TP.
    """
    plan = {name: patterns[p] for name, p in match_patterns(native_module_names(cfg), patterns).items()}
    heads = {"num_heads": cfg.num_attention_heads, "num_kv_heads": cfg.num_kv_heads}
    for i in range(cfg.num_layers):
        attention = n.attention(i)
        styles = {p: plan.get(f"{attention}.{p}") for p in n.PROJECTIONS}
        check_attention_split(attention, styles, heads, cfg.tensor_model_parallel_size)
