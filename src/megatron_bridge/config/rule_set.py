"""Every validation rule module, registered from this one explicit list, and running them.

``RULE_MODULES`` is the list: a new rule module is added here (and nowhere else); its rules run, and the rule table
of docs/training/config-container.md lists them, module by module in this order, registration order within a module.
``ConfigContainer.validate()`` calls :func:`check_rules`; builds and wrappers that skipped ``validate()`` call
:func:`enforce` for the rules they depend on, so the check and its message are never written twice.
"""

from types import ModuleType
from typing import TYPE_CHECKING

from megatron_bridge.config import (
    rules,
    rules_data,
    rules_device,
    rules_distributed,
    rules_engine,
    rules_model,
    rules_model_optimization,
    rules_moe,
    rules_pipeline,
    rules_precision,
)
from megatron_bridge.config.rule_registry import RULES, Rule, run_rules


if TYPE_CHECKING:
    from megatron_bridge.config.container import ConfigContainer

__all__ = ["RULES", "RULE_MODULES", "Rule", "check_rules", "enforce"]

RULE_MODULES: tuple[ModuleType, ...] = (
    rules,
    rules_data,
    rules_model,
    rules_engine,
    rules_distributed,
    rules_pipeline,
    rules_moe,
    rules_model_optimization,
    rules_precision,
    rules_device,
)
"""The rule modules, in the order their rules run."""

_ORDER = [m.__name__ for m in RULE_MODULES]
RULES.sort(key=lambda r: _ORDER.index(r.check.__module__) if r.check.__module__ in _ORDER else len(_ORDER))


def check_rules(cfg: "ConfigContainer", world_size: int, only: tuple[str, ...] | None = None) -> None:
    """Run every rule (or the rules whose ids are in ``only``); raise one ConfigValidationError listing all
    violations. Build and wrap time call it with ``only`` to enforce the same rule, with the same message."""
    run_rules(cfg, world_size, only)


def enforce(cfg: "ConfigContainer", *rule_ids: str, world_size: int | None = None) -> None:
    """Run the named rules at build or wrap time (for callers that skipped ``validate()``): the same check and
    message as ``validate()``, never a second copy of it. Callers holding one section check it inside
    ``ConfigContainer.holding(section)``. ``world_size`` defaults to the process group's."""
    from megatron_bridge.utils.dist_env import get_world_size

    check_rules(cfg, world_size if world_size is not None else get_world_size(), only=rule_ids)
