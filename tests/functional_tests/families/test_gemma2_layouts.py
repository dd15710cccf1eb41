"""The tiny Gemma 2 (attention scores soft-capped at 2 and logits at 3, weights drawn with std 0.1 so both caps act,
a 32-token window on the even layers of 4, post-norms, GeGLU, tied and scaled embedding) trains on DDP, FSDP2, TP=2
(on FSDP2: each rank caps its own heads' scores), CP=2 (all-gather attention: each rank caps its queries' scores over
the gathered keys) and PP=2 (the last stage keeps a copy of the tied embedding: distributed/tied_embeddings.py), each
step's loss within 1e-5 (relative) of one process on the same global batch, and resumes bit-exact. One 2-rank
torchrun launch runs every case (``pretrain()`` reuses the launch's process group); the launching process computes
the one-process reference.

Refused by name, checked here: CP with ring attention (rule ``logit_softcapping``: SDPA cannot cap the scores).
"""

import os
from pathlib import Path
from typing import Any

import pytest

from tests.functional_tests.families._tiny_layouts import run_layouts, tiny_config
from tests.functional_tests.launcher import LaunchGroups, is_worker, selected_groups
from tests.functional_tests.training._common import cached_reference


LAYOUTS: dict[str, dict[str, Any]] = {
    "ddp": {},
    "fsdp2": {"use_torch_fsdp2": True},
    "tp2": {"tensor_model_parallel_size": 2, "use_torch_fsdp2": True},
    "cp2": {"context_parallel_size": 2},
    "pp2": {"pipeline_model_parallel_size": 2},
}
REFUSED = {"logit_softcapping": {"context_parallel_size": 2, "model": {"cp_comm_type": "p2p"}}}
GROUPS = {2: ["test_tiny_gemma2_trains_on_its_layouts"]}

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def launches(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> LaunchGroups | None:
    """The launch (launching process only), with the path of the one-process reference."""
    if is_worker():
        return None
    env = {"MB_REFERENCE_GEMMA2": str(cached_reference(tiny_config("tiny_gemma2"), tmp_path_factory)),
           "MB_GEMMA2_DIR": str(tmp_path_factory.mktemp("gemma2_resume"))}
    return LaunchGroups(__file__, selected_groups(request, GROUPS), {2: 600}, env=env)


@pytest.mark.support_cells("gemma2:ddp", "gemma2:fsdp2", "gemma2:tp", "gemma2:cp", "gemma2:resume",
                            "gemma2:pp")
def test_tiny_gemma2_trains_on_its_layouts(launches: LaunchGroups | None) -> None:
    if not is_worker():
        launches.check("test_tiny_gemma2_trains_on_its_layouts")  # type: ignore[union-attr]
        return
    run_layouts("tiny_gemma2", LAYOUTS, REFUSED, os.environ["MB_REFERENCE_GEMMA2"], Path(os.environ["MB_GEMMA2_DIR"]))
