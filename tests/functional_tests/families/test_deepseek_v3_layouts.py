"""The tiny DeepSeek-V3 (multi-latent attention with YaRN, a dense first layer, 8 experts in 4 groups with the expert
bias and a shared expert) trains on the parallel layouts the library has for it, each step's loss within 1e-5
(relative) of one process on the same global batch, and resumes bit-exact. One 2-rank torchrun launch runs every case
(``pretrain()`` reuses the launch's process group); the launching process computes the one-process reference.

Layouts, each on 2 gloo ranks: DDP, FSDP2 with full activation recompute, TP=2 with sequence parallelism (on FSDP2;
the MLA heads split, the latent projections replicated), PP=2, EP=2 and CP=2 (all-gather
attention, the queries pre-scaled to MLA's softmax scale), and last Megatron FSDP with EP=2 through the CPU harness
(the experts sharded over the expert-data-parallel group).
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
    "fsdp2_recompute": {"use_torch_fsdp2": True, "model": {"recompute_granularity": "full",
                                                           "recompute_method": "uniform", "recompute_num_layers": 1}},
    "tp2_sp": {"tensor_model_parallel_size": 2, "use_torch_fsdp2": True, "sequence_parallel": True},
    "pp2": {"pipeline_model_parallel_size": 2},
    "ep2": {"expert_model_parallel_size": 2},
    "cp2": {"context_parallel_size": 2},
}
REFUSED: dict[str, dict[str, Any]] = {}
HARNESS_LAYOUTS = {"megatron_fsdp_ep2": {"use_megatron_fsdp": True, "expert_model_parallel_size": 2}}
"""Through the Megatron FSDP CPU harness, last: the experts split over EP=2 (expert-data-parallel size 1)."""
GROUPS = {2: ["test_tiny_deepseek_v3_trains_on_its_layouts"]}

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def launches(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> LaunchGroups | None:
    """The launch (launching process only), with the path of the one-process reference."""
    if is_worker():
        return None
    env = {"MB_REFERENCE_DEEPSEEK_V3": str(cached_reference(tiny_config("tiny_deepseek_v3"), tmp_path_factory)),
           "MB_DEEPSEEK_DIR": str(tmp_path_factory.mktemp("deepseek_resume"))}
    return LaunchGroups(__file__, selected_groups(request, GROUPS), {2: 600}, env=env)


@pytest.mark.support_cells("deepseek_v3:ddp", "deepseek_v3:fsdp2", "deepseek_v3:tp", "deepseek_v3:pp",
                            "deepseek_v3:ep", "deepseek_v3:resume", "deepseek_v3:cp",
                            "deepseek_v3:megatron_fsdp")
def test_tiny_deepseek_v3_trains_on_its_layouts(launches: LaunchGroups | None) -> None:
    if not is_worker():
        launches.check("test_tiny_deepseek_v3_trains_on_its_layouts")  # type: ignore[union-attr]
        return
    run_layouts("tiny_deepseek_v3", LAYOUTS, REFUSED, os.environ["MB_REFERENCE_DEEPSEEK_V3"],
                Path(os.environ["MB_DEEPSEEK_DIR"]), HARNESS_LAYOUTS)
