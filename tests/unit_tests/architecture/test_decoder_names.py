"""The shared decoder's module names are declared once (``config/decoder_names.py``) and asked for everywhere else:
none of them is written out (in code, comments or docstrings) in ``src/megatron_bridge`` outside ``models/`` (the
shared blocks), ``families/`` and that declaration, but for :data:`ALLOWED` (each entry with its reason).

The names checked are the distinctive ones; the generic words the tree also uses (``layers``, ``norm``, ``mlp``,
``router``, ``experts``) are left out, as prose uses them too."""

import re
from pathlib import Path

from megatron_bridge.config import decoder_names as n


SRC = Path(__file__).resolve().parents[3] / "src" / "megatron_bridge"
OWNERS = ("models/", "families/", "config/decoder_names.py")
"""Where the names live: the shared blocks that build the modules, the families that compose them, the declaration."""

ALLOWED: dict[tuple[str, str], str] = {
    ("engines/megatron_core/weights.py", n.ATTENTION_NORM):
        "megatron-core's own name for a layer's first norm (its local layer spec), the target side of the weight table",
    ("checkpoint/mcore_megatron_fsdp_weights.py", n.ATTENTION_NORM):
        "megatron-core's local-spec name that transformer-engine's fused norms are renamed to",
    ("engines/megatron_core/weights.py", n.SHARED_EXPERTS):
        "megatron-core's own name for an MoE layer's shared expert (its SharedExpertMLP), the target side of the table",
    ("checkpoint/mcore_megatron_fsdp_weights.py", n.SHARED_EXPERTS):
        "megatron-core's MoE module name in its checkpoint keys (refused there)",
}
"""(path under src/megatron_bridge, name) pairs allowed to stay; each fails the test once it no longer occurs."""


def distinctive_names() -> tuple[str, ...]:
    """The declared names the test looks for."""
    return (n.EMBEDDING, n.ROTARY, n.OUTPUT, n.ATTENTION_NORM, n.ATTENTION, n.MLP_NORM, *n.PROJECTIONS,
            *n.HEAD_NORMS, *n.MLP_PROJECTIONS, n.SHARED_EXPERTS)


def names_in(text: str, names: tuple[str, ...]) -> set[str]:
    """The ``names`` written out in ``text`` as whole identifiers (``q_norm`` is not in ``q_normal``)."""
    pattern = re.compile(r"(?<![A-Za-z0-9_])(" + "|".join(map(re.escape, names)) + r")(?![A-Za-z0-9_])")
    return set(pattern.findall(text))


def found() -> set[tuple[str, str]]:
    """Every (path, name) written out outside the owners."""
    hits = set()
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        if not rel.startswith(OWNERS):
            hits |= {(rel, name) for name in names_in(path.read_text(), distinctive_names())}
    return hits


def test_no_decoder_name_outside_its_owners() -> None:
    bad = sorted(found() - set(ALLOWED))
    assert not bad, ("the shared decoder's module names written out outside models/, families/ and "
                     "config/decoder_names.py (ask megatron_bridge.config.decoder_names instead):\n" +
                     "\n".join(f"  src/megatron_bridge/{path}: {name}" for path, name in bad))


def test_allow_list_only_shrinks() -> None:
    stale = sorted(set(ALLOWED) - found())
    assert not stale, f"no longer written out, remove from ALLOWED in {__file__}: {stale}"


def test_the_check_catches_what_it_should() -> None:
    names = distinctive_names()
    assert names_in('plan["layers.0.self_attn.q_proj"] = x  # o_proj', names) == {"self_attn", "q_proj", "o_proj"}
    assert names_in("q_normal, my_lm_head_x, self.q_layernorm, pre_mlp_layernorm", names) == set()
    assert names_in('"""the ``embed_tokens`` weight"""', names) == {"embed_tokens"}
