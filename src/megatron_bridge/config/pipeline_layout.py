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

Impossible splits raise :class:`PipelineLayoutError` naming the fields.
"""

from dataclasses import dataclass
from typing import Literal

from megatron_bridge.config.model import V_SCHEDULES, ModelConfig, resolve_schedule
from megatron_bridge.errors import ConfigValidationError


_FIRST, _LAST = "model.num_layers_in_first_pipeline_stage", "model.num_layers_in_last_pipeline_stage"
_EMB, _LOSS = "model.account_for_embedding_in_pipeline_split", "model.account_for_loss_in_pipeline_split"
_PP, _VP, _LAYERS = ("model.pipeline_model_parallel_size", "model.virtual_pipeline_model_parallel_size",
                     "model.num_layers")


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


def stage_layer_counts(m: ModelConfig, schedule: str | None = None) -> list[int]:
    """Decoder layers of every stage, in pipeline order (module docstring).

    Raises:
        PipelineLayoutError: the split is impossible.
    """
    pp, vp = m.pipeline_model_parallel_size, stages_per_rank(m)
    n_stages = pp * vp
    style = placement_style(schedule or resolve_schedule(m))
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
