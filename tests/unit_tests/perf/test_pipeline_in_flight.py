"""The memory estimate's chunk-micro-batches in flight per pipeline rank (perf/layout.py ``chunks_in_flight``)
against the action orders torch.distributed.pipelining itself generates for each schedule.

The orders come from each schedule class's ``_calculate_single_rank_operations`` (torch's private API, computed
without a process group); a change in torch that changes them fails here, so the formulas are re-checked."""

from dataclasses import replace

import pytest
from torch.distributed.pipelining import schedules as S
from torch.distributed.pipelining.schedules import _ComputationType

from megatron_bridge.perf.layout import Layout, chunks_in_flight


_FREES = (_ComputationType.FULL_BACKWARD, _ComputationType.BACKWARD_WEIGHT)
_LAYOUT = Layout(world_size=1, tp=1, pp=1, vp=1, cp=1, ep=1, etp=1, dp=1, backend="ddp", micro_batch_size=1,
                 num_microbatches=1, seq_length=8, sequence_parallel=False, pipeline_schedule="none")


def _torch_orders(cls: type, pp: int, vp: int, m: int) -> dict[int, list]:
    sched = object.__new__(cls)
    sched.pp_group_size, sched.n_local_stages, sched._n_microbatches = pp, vp, m
    sched.number_of_rounds = max(1, m // pp)
    sched.microbatches_per_round = m // sched.number_of_rounds
    sched.num_stages = sched._num_stages = pp * vp
    return {r: sched._calculate_single_rank_operations(r) for r in range(pp)}


def _max_alive(actions: list) -> int:
    """Most (stage, micro-batch) pairs between their forward and their (full or weight) backward."""
    alive: set[tuple[int, int]] = set()
    most = 0
    for action in actions:
        for a in (getattr(action, "sub_actions", None) or [action]) if action is not None else []:
            key = (a.stage_index, a.microbatch_index)
            if a.computation_type == _ComputationType.FORWARD:
                alive.add(key)
            elif a.computation_type in _FREES:
                alive.discard(key)
            most = max(most, len(alive))
    return most


GRID = [(pp, vp, m) for pp in (2, 4, 8) for vp in (2, 3, 4) for m in (1, 2, 3, pp, 2 * pp, 3 * pp, 4 * pp)
        if m % max(1, m // pp) == 0]


@pytest.mark.parametrize("schedule", ["Interleaved1F1B", "InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV"])
def test_in_flight_matches_torchs_schedule_orders(schedule: str) -> None:
    cls = getattr(S, f"Schedule{schedule}")
    checked = 0
    for pp, vp, m in GRID:
        if schedule in ("ZBVZeroBubble", "DualPipeV") and vp != 2:
            continue
        if schedule == "DualPipeV" and m < 2 * pp:  # validation requires PP×VP micro-batches
            continue
        layout = replace(_LAYOUT, pp=pp, vp=vp, num_microbatches=m, pipeline_schedule=schedule)
        for rank, actions in _torch_orders(cls, pp, vp, m).items():
            assert chunks_in_flight(layout, rank) == _max_alive(actions), (schedule, pp, vp, m, rank)
            checked += 1
    assert checked >= 20


def test_1f1b_and_no_pipeline() -> None:
    """1F1B (torch's Schedule1F1B: min(m, PP − stage) warm-up forwards, then backward first) and PP = 1."""
    for pp in (2, 4, 8):
        for m in (1, 2, pp, 4 * pp):
            layout = replace(_LAYOUT, pp=pp, num_microbatches=m, pipeline_schedule="1F1B")
            assert [chunks_in_flight(layout, r) for r in range(pp)] == [min(m, pp - r) for r in range(pp)]
    assert chunks_in_flight(_LAYOUT, 0) == 1
