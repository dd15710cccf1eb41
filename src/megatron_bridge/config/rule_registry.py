"""The validation-rule machinery: a rule is one small function registered with an id, the config paths it reads and
a one-line summary; ``run_rules`` runs the registered ones and raises one error listing every violation.

The rule modules (``rules.py``, ``rules_*.py``) import this module and register with :func:`rule`; which modules
exist, and the order their rules run in, is the one explicit list of :mod:`.rule_set`, which callers use.
"""

from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING

from megatron_bridge.errors import ConfigValidationError


if TYPE_CHECKING:
    from megatron_bridge.config.container import ConfigContainer


class RuleViolation(Exception):
    """Raised inside a rule outside ``run_rules``; collected by it."""

    def __init__(self, message: str, *paths: str) -> None:
        super().__init__(message)
        self.paths = paths


@dataclass(frozen=True)
class Rule:
    """A validation rule: its id, the config paths it reads, a one-line summary, and its check."""

    id: str
    paths: tuple[str, ...]
    summary: str
    check: Callable[["ConfigContainer", int], None]


RULES: list[Rule] = []
"""Every registered rule; :mod:`.rule_set` orders them module by module in its list's order."""

MAX_SIZE = 2**31 - 1
"""The largest size, count or interval (int32, as Megatron's): larger ones overflow the model build, the layer lists
and the timeouts. ``train.train_samples`` may exceed it (rule ``run_length_fits`` bounds it)."""


def positive(*values: object) -> bool:
    """Whether every value is an int in 1..MAX_SIZE: rules check the sizes they divide or allocate by with it first
    (rule ``positive_sizes`` names the bad ones)."""
    return all(isinstance(v, int) and not isinstance(v, bool) and 0 < v <= MAX_SIZE for v in values)


def rule(id: str, paths: tuple[str, ...], summary: str) -> Callable:
    """Register a rule function ``check(cfg, world_size)`` that reports violations with :func:`fail`."""

    def wrap(fn: Callable[["ConfigContainer", int], None]) -> Callable[["ConfigContainer", int], None]:
        RULES.append(Rule(id, paths, summary, fn))
        return fn

    return wrap


_REPORTED: ContextVar[list[RuleViolation] | None] = ContextVar("megatron_bridge_rule_violations", default=None)
"""The violations the running rule reported so far (None outside :func:`run_rules`)."""


def fail(message: str, *paths: str) -> None:
    """Report a violation of the running rule, which goes on checking (``return`` after it where later checks read
    the refused value). Outside :func:`run_rules` it raises RuleViolation."""
    violation = RuleViolation(message, *paths)
    reported = _REPORTED.get()
    if reported is None:
        raise violation
    reported.append(violation)


def _run(r: Rule, cfg: "ConfigContainer", world_size: int) -> list[RuleViolation]:
    reported: list[RuleViolation] = []
    token = _REPORTED.set(reported)
    try:
        r.check(cfg, world_size)
    except RuleViolation as v:  # a rule may still raise its last violation
        reported.append(v)
    finally:
        _REPORTED.reset(token)
    return reported


def run_rules(cfg: "ConfigContainer", world_size: int, only: tuple[str, ...] | None = None) -> None:
    """Run every registered rule (or those whose ids are in ``only``); raise one ConfigValidationError listing every
    violation of every rule."""
    if not positive(world_size):
        raise ConfigValidationError(f"the world size must be an int >= 1 (got {world_size!r}): it is the number of "
                                    "processes (validate(world_size=N), run_recipe.py --nproc N)", ("world_size",))
    problems: list[tuple[str, RuleViolation]] = []
    for r in RULES:
        if only is None or r.id in only:
            problems += [(r.id, v) for v in _run(r, cfg, world_size)]
    if not problems:
        return
    paths = tuple(dict.fromkeys(p for _, v in problems for p in v.paths))
    if len(problems) == 1:
        rule_id, v = problems[0]
        raise ConfigValidationError(f"{v} [rule {rule_id}]", paths)
    lines = "\n".join(f"  - {v} [rule {rule_id}]" for rule_id, v in problems)
    raise ConfigValidationError(f"{len(problems)} config problems:\n{lines}", paths)
