#!/usr/bin/env python3
"""Rewrite the line ranges of every code anchor in skills/*/SKILL.md to where the symbols are now."""

import sys
from pathlib import Path

from megatron_bridge.utils.anchors import refresh_anchors


REPO = Path(__file__).resolve().parents[2]


def main() -> int:
    """Entry point."""
    for skill in sorted((REPO / "skills").glob("*/SKILL.md")):
        text = skill.read_text()
        new = refresh_anchors(text, REPO)
        if new != text:
            skill.write_text(new)
            print(f"updated {skill.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    from megatron_bridge.utils.cli import run_cli

    sys.exit(run_cli(main))
