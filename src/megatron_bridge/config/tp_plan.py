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


def check_mla_split(attention: str, plan: dict[str, str], cfg: "ModelConfig") -> None:
    """A multi-latent attention is split whole or not at all: its head-producing projections (the query projection
    or up-projection, and the key/value up-projection) all ``colwise`` with the output projection ``rowwise``, heads
    divisible by TP; its latent down-projections and norms are never split (megatron-core keeps them whole).

    Raises:
        ConfigValidationError: the attention is split partly, a latent module is split, or heads do not divide.
    """
    heads = [n.Q_PROJ if cfg.q_lora_rank is None else n.MLA_Q_UP, n.MLA_KV_UP]
    styles = {p: plan.get(f"{attention}.{p}") for p in (*heads, n.O_PROJ)}
    latents = [p for p in n.mla_modules(cfg) if p not in styles and plan.get(f"{attention}.{p}") in
               ("colwise", "rowwise")]
    if latents:
        raise ConfigValidationError(f"fsdp2.tp_plan splits {attention}.{latents[0]}: the latent projections and norms "
                                    "of multi-latent attention stay whole on every TP rank (leave them out)",
                                    ("fsdp2.tp_plan",))
    if all(styles[p] != "colwise" for p in heads) and styles[n.O_PROJ] != "rowwise":
        return
    if not (all(styles[p] == "colwise" for p in heads) and styles[n.O_PROJ] == "rowwise"):
        raise ConfigValidationError(
            f"fsdp2.tp_plan shards {attention} partly: {' and '.join(heads)} must be 'colwise' and {n.O_PROJ} "
            "'rowwise' (heads are split over the TP group), or none of them sharded.", ("fsdp2.tp_plan",))
    if cfg.num_attention_heads % cfg.tensor_model_parallel_size:
        raise ConfigValidationError(f"{attention}: {cfg.num_attention_heads} heads are not divisible by "
                                    f"model.tensor_model_parallel_size={cfg.tensor_model_parallel_size}.",
                                    ("model.tensor_model_parallel_size",))


def check_custom_plan(cfg: "ModelConfig", patterns: dict[str, str]) -> None:
    """Resolve ``fsdp2.tp_plan`` against the native model's module names and check every attention's split, as
    applying the plan will (rule ``tp_plan_matches_model`` of ``validate()``).

    Raises:
        ConfigValidationError: the plan matches no module, shards an attention partly, or heads do not divide by TP.
    """
    plan = {name: patterns[p] for name, p in match_patterns(native_module_names(cfg), patterns).items()}
    if cfg.multi_latent_attention:
        for i in range(cfg.num_layers):
            check_mla_split(n.attention(i), plan, cfg)
        return
    heads = {"num_heads": cfg.num_attention_heads, "num_kv_heads": cfg.num_kv_heads}
    for i in range(cfg.num_layers):
        attention = n.attention(i)
        styles = {p: plan.get(f"{attention}.{p}") for p in n.PROJECTIONS}
        check_attention_split(attention, styles, heads, cfg.tensor_model_parallel_size)
