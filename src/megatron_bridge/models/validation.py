"""Checks that a :class:`ModelConfig` can be built, as the build enforces them.

Each check is a registered validation rule (:mod:`megatron_bridge.config.rules_model`, ...), so ``validate()`` and
``--dry-run`` refuse the same configs with the same messages; these functions enforce those rules when a model is
built without ``validate()``.
"""

from megatron_bridge.config.container import ConfigContainer
from megatron_bridge.config.model import ModelConfig
from megatron_bridge.config.rule_set import check_rules
from megatron_bridge.config.rules_model import ARCHITECTURE_RULES, LAYOUT_RULES, is_importable


__all__ = ["check_model_buildable", "check_parallel_layout", "check_transformer_impl", "is_importable",
           "validate_model_config"]


def check_model_buildable(model: ModelConfig, rules: tuple[str, ...] = ARCHITECTURE_RULES + LAYOUT_RULES) -> None:
    """Enforce ``rules`` on ``model`` alone (model builds without ``validate()``), with the errors ``validate()``
    gives for them.

    Raises:
        ConfigValidationError: a violated rule, naming the field and the fix.
    """
    check_rules(ConfigContainer(model=model), 1, only=rules)


def check_transformer_impl(config: ModelConfig) -> None:
    """Raise ConfigValidationError unless ``config.transformer_impl`` is an engine this version builds (rule
    ``transformer_impl_available``: a GPU engine that is missing, or installed but not wired)."""
    check_model_buildable(config, ("transformer_impl_available",))


def check_parallel_layout(config: ModelConfig) -> None:
    """Raise ConfigValidationError for model-parallel layouts the engine does not build (rule
    ``engine_parallel_layout``)."""
    check_model_buildable(config, LAYOUT_RULES)


def validate_model_config(config: ModelConfig) -> None:
    """Raise ConfigValidationError if the fields of ``config`` cannot form a model (:data:`ARCHITECTURE_RULES`)."""
    check_model_buildable(config, ARCHITECTURE_RULES)
