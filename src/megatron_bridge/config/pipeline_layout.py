"""Where every decoder layer goes under pipeline parallelism: stages, their layers, and the rank holding each stage.

Pure arithmetic on :class:`~megatron_bridge.config.model.ModelConfig` (no torch), shared by the validation rules and
by the model provider, so what ``validate()`` accepts is exactly what gets built.

Stages are numbered in pipeline order ``0 .. PP×VP−1`` (VP = ``virtual_pipeline_model_parallel_size`` or 1); stage
``s`` holds a contiguous run of decoder layers, stage 0 also the embedding, the last stage the final norm, the
output layer and the loss. Placement on pipeline ranks follows the schedule: "loop" (1F1B, Interleaved1F1B,
InterleavedZeroBubble; Megatron's interleaving) puts stage ``s`` on rank ``s % PP``; "v" (ZBVZeroBubble, DualPipeV)
puts stages ``r`` and ``2·PP−1−r`` on rank ``r``.

Layer counts per stage (Megatron-Bridge's options):

* even: ``num_layers / (PP×VP)`` each;
* ``account_for_embedding_in_pipeline_split`` / ``account_for_loss_in_pipeline_split``: the embedding (loss) counts
  as one layer: ``(num_layers + 1 [+ 1]) / (PP×VP)`` each, the first (last) stage one decoder layer fewer;
* ``num_layers_in_first_pipeline_stage`` / ``num_layers_in_last_pipeline_stage``: the first (last) pipeline *rank*
  holds that many layers, the middle ranks share the rest evenly; a rank's layers are split evenly over its VP stages.

An explicit ``model.pipeline_model_parallel_layout`` (megatron-core's ``PipelineParallelLayerLayout`` forms: a string
``"Et|(tt|)*6,tL"`` or a list of lists of "embedding" / "decoder" / "mtp" / "loss") gives every stage its decoder
layers instead (:func:`parse_layout`, :func:`layout_layer_counts`); a stage may then hold only the embedding or only
the output layer and loss.

Impossible splits raise :class:`PipelineLayoutError` naming the fields (and, for a layout, the stage).
"""

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from megatron_bridge.config.model import V_SCHEDULES, ModelConfig, resolve_schedule
from megatron_bridge.errors import ConfigValidationError


_FIRST, _LAST = "model.num_layers_in_first_pipeline_stage", "model.num_layers_in_last_pipeline_stage"
_EMB, _LOSS = "model.account_for_embedding_in_pipeline_split", "model.account_for_loss_in_pipeline_split"
_PP, _VP, _LAYERS = ("model.pipeline_model_parallel_size", "model.virtual_pipeline_model_parallel_size",
                     "model.num_layers")
_LAYOUT = "model.pipeline_model_parallel_layout"
LAYOUT_CHARS: dict[str, str] = {"E": "embedding", "t": "decoder", "m": "mtp", "L": "loss"}
"""The letters of the string form (megatron-core's ``PipelineParallelLayerLayout.parse_str_to_list``)."""
LAYOUT_KINDS = ("embedding", "decoder", "mtp", "loss")
"""The entries of the list form (megatron-core's ``LayerType`` names; "encoder" is not built there either)."""
_REPEATS = (re.compile(r"\(([^)]+)\)\*(\d+)"), re.compile(r"(.)\*(\d+)"))


class PipelineLayoutError(ConfigValidationError):
    """The pipeline fields of ``cfg.model`` cannot split the model (the message names the fields and the fix)."""


@dataclass(frozen=True)
class StageSpec:
    """One pipeline stage: its index, its rank and what it holds."""

    index: int
    """Stage index in pipeline order."""
    rank: int
    """Pipeline rank holding it."""
    layers: tuple[int, ...]
    """Global indices of its decoder layers."""
    num_stages: int
    """Stages in the whole pipeline."""

    @property
    def is_first(self) -> bool:
        """Holds the embedding."""
        return self.index == 0

    @property
    def is_last(self) -> bool:
        """Holds the final norm, the output layer and the loss."""
        return self.index == self.num_stages - 1


def stages_per_rank(m: ModelConfig) -> int:
    """Virtual stages (model chunks) per pipeline rank."""
    return m.virtual_pipeline_model_parallel_size or 1


def placement_style(schedule: str) -> Literal["loop", "v"]:
    """"v" for the V-shaped schedules, else "loop"."""
    return "v" if schedule in V_SCHEDULES else "loop"


def rank_of_stage(stage: int, pp: int, style: str) -> int:
    """Pipeline rank holding ``stage`` (module docstring)."""
    if style == "v":
        round_, pos = divmod(stage, pp)
        return pos if round_ % 2 == 0 else pp - 1 - pos
    return stage % pp


def _rank_counts_uneven(m: ModelConfig, pp: int, vp: int) -> list[int]:
    first, last = m.num_layers_in_first_pipeline_stage, m.num_layers_in_last_pipeline_stage
    if m.account_for_embedding_in_pipeline_split or m.account_for_loss_in_pipeline_split:
        raise PipelineLayoutError(
            "model.num_layers_in_first/last_pipeline_stage cannot be combined with model.account_for_embedding/"
            "loss_in_pipeline_split (as in Megatron-Bridge): use one way of splitting", (_FIRST, _LAST, _EMB, _LOSS))
    if pp < 2:
        raise PipelineLayoutError(
            f"model.num_layers_in_first/last_pipeline_stage need model.pipeline_model_parallel_size > 1 (got {pp}): "
            "set them to None", (_FIRST, _LAST, _PP))
    counts: list[int | None] = [None] * pp
    remaining, middle = m.num_layers, pp
    for path, value, rank in ((_FIRST, first, 0), (_LAST, last, pp - 1)):
        if value is None:
            continue
        if value <= 0:
            raise PipelineLayoutError(f"{path}={value} must be > 0", (path,))
        counts[rank] = value
        remaining -= value
        middle -= 1
    if remaining < 0 or bool(remaining) != bool(middle):
        raise PipelineLayoutError(
            f"model.num_layers={m.num_layers} leaves {remaining} layer(s) for {middle} middle pipeline rank(s) after "
            f"the first ({first}) and last ({last}) ranks: change model.num_layers_in_first/last_pipeline_stage",
            (_FIRST, _LAST, _LAYERS))
    if middle and remaining % middle:
        raise PipelineLayoutError(
            f"the {remaining} middle layers do not split evenly over {middle} middle pipeline rank(s): change "
            "model.num_layers_in_first/last_pipeline_stage", (_FIRST, _LAST, _LAYERS))
    per_middle = remaining // middle if middle else 0
    full = [c if c is not None else per_middle for c in counts]
    uneven = tuple(path for path, value in ((_FIRST, first), (_LAST, last)) if value is not None)
    for rank, count in enumerate(full):
        if count % vp:
            raise PipelineLayoutError(
                f"pipeline rank {rank} holds {count} layers, not divisible by "
                f"model.virtual_pipeline_model_parallel_size={vp} (each rank's layers split evenly over its virtual "
                f"stages): change {' / '.join(uneven)} or model.num_layers", (*uneven, _LAYERS, _VP))
    return full


def parse_layout(layout: str | Sequence[Sequence[str]]) -> list[tuple[str, ...]]:
    """Every stage's entries ("embedding", "decoder", "mtp", "loss"), in pipeline order, from either form.

    Raises:
        PipelineLayoutError: an unknown letter or entry, or a stage that is not a list.
    """
    if isinstance(layout, str):
        text = layout.replace(",", "")
        for pattern in _REPEATS:
            text = pattern.sub(lambda match: match.group(1) * int(match.group(2)), text)
        stages: Sequence[Sequence[str]] = [list(stage) for stage in text.split("|")]
        known, spell = LAYOUT_CHARS, "letter"
    elif isinstance(layout, Sequence):
        stages, known, spell = layout, {k: k for k in LAYOUT_KINDS}, "entry"
    else:
        raise PipelineLayoutError(f"{_LAYOUT}={layout!r} is neither a layout string nor a list of lists", (_LAYOUT,))
    parsed = []
    for index, stage in enumerate(stages):
        if isinstance(stage, str) or not isinstance(stage, Sequence):
            raise PipelineLayoutError(f"{_LAYOUT}: stage {index} is {stage!r}, not a list of layer kinds: write a "
                                      f"list of lists (each of {list(LAYOUT_KINDS)}) or the string form", (_LAYOUT,))
        entries = [e.strip().lower() if isinstance(e, str) and spell == "entry" else e for e in stage]
        bad = [e for e in entries if not isinstance(e, str) or e not in known]
        if bad:
            raise PipelineLayoutError(f"{_LAYOUT}={layout!r}: stage {index} has the unknown {spell} {bad[0]!r}: use "
                                      f"{list(known)}", (_LAYOUT,))
        parsed.append(tuple(known[e] for e in entries))
    return parsed


def _where(stage: int, pp: int, style: str) -> str:
    return f"stage {stage} (pipeline rank {rank_of_stage(stage, pp, style)})"


def _check_layout_edges(stages: list[tuple[str, ...]], pp: int, style: str) -> None:
    """One embedding, first in stage 0; one loss, last in the last stage; no MTP."""
    last = len(stages) - 1
    for index, stage in enumerate(stages):
        if "mtp" in stage:
            raise PipelineLayoutError(
                f"{_LAYOUT}: {_where(index, pp, style)} holds an MTP layer ('m' / 'mtp'): this version places "
                "no multi-token prediction layers in pipeline stages (model.mtp_num_layers is built with "
                "pipeline_model_parallel_size=1 only, rule multi_token_prediction); remove the MTP entries", (_LAYOUT,))
        for kind, home, pos, letter in (("embedding", 0, 0, "E"), ("loss", last, -1, "L")):
            if kind in stage and (index != home or stage[pos] != kind or stage.count(kind) > 1):
                place = "the first entry of stage 0" if kind == "embedding" else f"the last entry of stage {last}"
                raise PipelineLayoutError(
                    f"{_LAYOUT}: {_where(index, pp, style)} is {list(stage)}: the layout holds exactly one {kind!r} "
                    f"('{letter}'), as {place}; move it there", (_LAYOUT,))
    for kind, home, letter in (("embedding", 0, "E"), ("loss", last, "L")):
        if kind not in stages[home]:
            raise PipelineLayoutError(f"{_LAYOUT}: {_where(home, pp, style)} holds no {kind!r} entry ({stages[home]}):"
                                      f" add '{letter}' to it", (_LAYOUT,))


def layout_layer_counts(m: ModelConfig, style: str) -> list[int]:
    """Decoder layers of every stage under ``model.pipeline_model_parallel_layout``, in pipeline order.

    Raises:
        PipelineLayoutError: the layout does not fit the model or the pipeline (the message names the stage).
    """
    others = [p for p, v in ((_FIRST, m.num_layers_in_first_pipeline_stage),
                             (_LAST, m.num_layers_in_last_pipeline_stage),
                             (_EMB, m.account_for_embedding_in_pipeline_split),
                             (_LOSS, m.account_for_loss_in_pipeline_split)) if v not in (None, False)]
    if others:
        raise PipelineLayoutError(f"{_LAYOUT} cannot be combined with {', '.join(others)} (as in megatron-core): the "
                                  "layout says what every stage holds; unset the others", (_LAYOUT, *others))
    stages = parse_layout(m.pipeline_model_parallel_layout)
    pp, vp = m.pipeline_model_parallel_size, stages_per_rank(m)
    if len(stages) != pp * vp:
        fix = (f"set {_VP}={len(stages) // pp}" if len(stages) % pp == 0 and len(stages) > pp else
               f"write {pp * vp} stages")
        raise PipelineLayoutError(f"{_LAYOUT} has {len(stages)} stage(s), but PP × VP = {pp} × {vp} = {pp * vp} "
                                  f"pipeline stages run: {fix}", (_LAYOUT, _PP, _VP))
    _check_layout_edges(stages, pp, style)
    counts = [stage.count("decoder") for stage in stages]
    if sum(counts) != m.num_layers:
        raise PipelineLayoutError(f"{_LAYOUT} holds {sum(counts)} decoder layers (per stage: {counts}), but "
                                  f"model.num_layers={m.num_layers}: make them equal", (_LAYOUT, _LAYERS))
    for index, stage in enumerate(stages):
        if not stage and m.engine == "native":
            raise PipelineLayoutError(
                f"{_LAYOUT}: {_where(index, pp, style)} is empty: the native engine builds no stage without "
                "parameters (torch's DDP refuses a module without any); give it a decoder layer", (_LAYOUT,))
    return counts


def stage_layer_counts(m: ModelConfig, schedule: str | None = None) -> list[int]:
    """Decoder layers of every stage, in pipeline order (module docstring).

    Raises:
        PipelineLayoutError: the split is impossible.
    """
    pp, vp = m.pipeline_model_parallel_size, stages_per_rank(m)
    n_stages = pp * vp
    style = placement_style(schedule or resolve_schedule(m))
    if m.pipeline_model_parallel_layout is not None:
        return layout_layer_counts(m, style)
    if m.num_layers_in_first_pipeline_stage is not None or m.num_layers_in_last_pipeline_stage is not None:
        ranks = _rank_counts_uneven(m, pp, vp)
        return [ranks[rank_of_stage(s, pp, style)] // vp for s in range(n_stages)]
    emb, loss = int(m.account_for_embedding_in_pipeline_split), int(m.account_for_loss_in_pipeline_split)
    total = m.num_layers + emb + loss
    if total % n_stages:
        extra = f" + {emb + loss} (embedding/loss counted as layers)" if emb + loss else ""
        raise PipelineLayoutError(
            f"model.num_layers={m.num_layers}{extra} does not split evenly over PP×VP = {pp}×{vp} = {n_stages} "
            "pipeline stages: change model.pipeline_model_parallel_size / "
            "model.virtual_pipeline_model_parallel_size, or split unevenly with "
            "model.num_layers_in_first/last_pipeline_stage or model.account_for_embedding/loss_in_pipeline_split",
            (_LAYERS, _PP, _VP))
    counts = [total // n_stages] * n_stages
    counts[0] -= emb
    counts[-1] -= loss
    return counts


def build_stage_specs(m: ModelConfig) -> list[StageSpec]:
    """Every stage of the pipeline with its rank and its global layer indices."""
    schedule = resolve_schedule(m)
    counts = stage_layer_counts(m, schedule)
    style = placement_style(schedule)
    specs, start = [], 0
    for index, count in enumerate(counts):
        specs.append(StageSpec(index, rank_of_stage(index, m.pipeline_model_parallel_size, style),
                               tuple(range(start, start + count)), len(counts)))
        start += count
    return specs


def stages_of_rank(m: ModelConfig, pp_rank: int) -> list[StageSpec]:
    """The stages pipeline rank ``pp_rank`` holds, in increasing stage order (its model chunks)."""
    return [spec for spec in build_stage_specs(m) if spec.rank == pp_rank]
