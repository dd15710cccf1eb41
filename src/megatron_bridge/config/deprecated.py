"""Megatron-Bridge's deprecated config keys that moved to another section, read from YAML and ``a.b=c`` overrides.

Megatron-Bridge still declares ``train.eval_iters`` and ``train.eval_interval`` (deprecated in favour of
``validation.*``; ``ConfigContainer.validate`` copies a value that is set over the ``validation`` one with a
warning), and its own tutorial YAML sets them. Here they are moved at load time with one logged line; ``null`` (its
"not set", as its ``to_yaml`` writes them) is dropped.
"""

import logging
from typing import Any

from megatron_bridge.utils.logging import get_logger, log_rank_0


logger = get_logger(__name__)

MOVED_KEYS: dict[str, str] = {
    "train.eval_iters": "validation.eval_iters",
    "train.eval_interval": "validation.eval_interval",
}
"""Megatron-Bridge's deprecated dotted key → where it lives (here and there)."""


def move_deprecated_keys(data: dict[str, Any], log: bool = True) -> dict[str, Any]:
    """A copy of the nested config mapping ``data`` with :data:`MOVED_KEYS` moved (the deprecated key wins, as in
    Megatron-Bridge), each move logged unless ``log`` is False; ``data`` is left as it is."""
    out = dict(data)
    for old, new in MOVED_KEYS.items():
        (old_section, old_key), (new_section, new_key) = old.split("."), new.split(".")
        section = out.get(old_section)
        if not isinstance(section, dict) or old_key not in section:
            continue
        section = dict(section)
        value = section.pop(old_key)
        out[old_section] = section
        if value is None:
            continue
        if log:
            log_rank_0(logger, "%s is deprecated (as in Megatron-Bridge): set %s instead; using %s=%r", old, new, new,
                       value, level=logging.WARNING)
        target = out.get(new_section)
        out[new_section] = {**(target if isinstance(target, dict) else {}), new_key: value}
    return out
