"""A custom ``fsdp2.tp_plan`` checked against the native model's module names, without building the model.

The rule ``tp_plan_matches_model`` (``validate()``) needs to know which modules the native ``LlamaModel`` has for a
:class:`~megatron_bridge.config.model.ModelConfig`; :func:`native_module_names` lists them from the config alone
(torch-free, the config floor), in ``named_modules()`` order, and
``tests/unit_tests/models/test_native_module_names.py`` keeps it equal to the built model's. Applying a plan to a
real model is :mod:`megatron_bridge.distributed.tensor_parallel`, which refuses the same plans with the same messages.
"""

from fnmatch import fnmatchcase
from typing import TYPE_CHECKING

from megatron_bridge.errors import ConfigValidationError


if TYPE_CHECKING:
    from megatron_bridge.config.model import ModelConfig

_ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")


def _mlp_names(cfg: "ModelConfig", prefix: str, moe: bool) -> list[str]:
    if not moe:
        gate = ["gate_proj"] if cfg.activation == "swiglu" else []
        return [prefix] + [f"{prefix}.{n}" for n in (*gate, "up_proj", "down_proj")]
    names = [prefix, f"{prefix}.router", f"{prefix}.experts"]
    if cfg.moe_shared_expert_intermediate_size:
        shared = f"{prefix}.shared_experts"
        names += [shared] + [f"{shared}.{n}" for n in ("gate_proj", "up_proj", "down_proj")]
    return names


def _layer_names(cfg: "ModelConfig", i: int, moe: bool) -> list[str]:
    layer, attn = f"layers.{i}", f"layers.{i}.self_attn"
    norms = [f"{attn}.q_norm", f"{attn}.k_norm"] if cfg.qk_layernorm else []
    return [layer, f"{layer}.input_layernorm", attn, *(f"{attn}.{n}" for n in _ATTENTION), *norms,
            f"{layer}.post_attention_layernorm", *_mlp_names(cfg, f"{layer}.mlp", moe)]


def native_module_names(cfg: "ModelConfig") -> list[str]:
    """The fully qualified module names of the whole native ``LlamaModel`` built from ``cfg`` (``""`` is the
    model itself), in ``named_modules()`` order."""
    moe = cfg.moe_layer_pattern()
    names = ["", "embed_tokens", "rotary_emb", "layers"]
    for i in range(cfg.num_layers):
        names += _layer_names(cfg, i, bool(moe[i]))
    names.append("norm")
    if not cfg.share_embeddings_and_output_weights:
        names.append("lm_head")
    return names


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
            "fnmatch against fully qualified names such as 'layers.*.self_attn.q_proj'.", ("fsdp2.tp_plan",),
        )
    return matched


def check_attention_split(attention: str, styles: dict[str, str | None], heads: dict[str, int], tp: int) -> bool:
    """Whether an attention module (``styles`` of q/k/v/o_proj) is split over TP; it must be split whole, and its
    head counts (``heads``: ``num_heads``, ``num_kv_heads``) must divide by ``tp``.

    Raises:
        ConfigValidationError: the attention is split partly, or a head count does not divide by ``tp``.
    """
    if "colwise" not in styles.values():
        return False
    if not (all(styles[p] == "colwise" for p in _ATTENTION[:3]) and styles["o_proj"] == "rowwise"):
        raise ConfigValidationError(
            f"fsdp2.tp_plan shards {attention} partly: q_proj, k_proj and v_proj must all be 'colwise' and o_proj "
            "'rowwise' (heads are split over the TP group), or none of them sharded.", ("fsdp2.tp_plan",),
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
        attention = f"layers.{i}.self_attn"
        styles = {p: plan.get(f"{attention}.{p}") for p in _ATTENTION}
        check_attention_split(attention, styles, heads, cfg.tensor_model_parallel_size)
