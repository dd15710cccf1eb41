"""The suite's functional streams (tests/conftest.py): every functional file in one stream per xdist worker, the
files that share a launch or a cached reference together, the measured cost balanced."""

from tests.conftest import FUNCTIONAL_PREFIX, FUNCTIONAL_S, SAME_STREAM, UNMEASURED_S, functional_streams
from tests.functional_tests.launcher import SHARED_LAUNCHES


def _files() -> list[str]:
    named = {f for together in SAME_STREAM for f in together} | set(FUNCTIONAL_S)
    return [FUNCTIONAL_PREFIX + f for f in sorted(named)] + [FUNCTIONAL_PREFIX + "new/test_unmeasured.py"]


def test_every_file_gets_one_of_n_streams() -> None:
    for n in (1, 2, 3):
        streams = functional_streams(_files(), n)
        assert set(streams) == set(_files()) and set(streams.values()) <= set(range(n))
    assert set(functional_streams(_files(), 2).values()) == {0, 1}


def test_files_sharing_a_launch_or_a_reference_share_a_stream() -> None:
    streams = functional_streams(_files(), 2)
    for together in SAME_STREAM:
        assert len({streams[FUNCTIONAL_PREFIX + f] for f in together}) == 1, together
    for shared in SHARED_LAUNCHES:
        assert len({streams[f] for f in shared.files}) == 1, shared.name


def test_streams_are_balanced_by_measured_cost() -> None:
    """Longest-processing-time first: the streams' loads differ by at most the heaviest unit (a file, or files kept
    together)."""
    def cost(file: str) -> float:
        return FUNCTIONAL_S.get(file.removeprefix(FUNCTIONAL_PREFIX), UNMEASURED_S)

    streams = functional_streams(_files(), 2)
    load = [0.0, 0.0]
    for file, stream in streams.items():
        load[stream] += cost(file)
    together = [sum(cost(FUNCTIONAL_PREFIX + f) for f in files) for files in SAME_STREAM]
    assert abs(load[0] - load[1]) <= max([*together, *map(cost, _files())])
