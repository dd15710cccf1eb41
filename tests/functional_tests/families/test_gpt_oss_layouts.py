"""The tiny GPT-OSS (attention sinks and biases, a 32-token window on every other layer, YaRN, 8 experts with the
clamped quick-GeGLU, expert and router biases) trains on the parallel layouts the library has for it, each step's loss
within 1e-5 (relative) of one process on the same global batch, and resumes bit-exact at EP=2 (the expert weights
and biases checkpointed as global tensors). One 2-rank torchrun launch runs every case (``pretrain()`` reuses the
launch's process group); the launching process computes the one-process reference.

Layouts, each on 2 gloo ranks: DDP, FSDP2, TP=2 with sequence parallelism (on FSDP2; EP folded over TP: the experts
and their biases whole and replicated on both TP ranks, each routing its half of the tokens), PP=2, EP=2 (the
expert biases sharded with their experts) and CP=2 (all-gather attention: ring attention has no sink column, rule
``attention_sinks``), and last Megatron FSDP through the CPU harness (EP=1: the experts and their biases sharded over
both ranks). Refused by name, checked here: expert tensor parallelism with expert biases (rule ``moe_expert_bias``).
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
    "tp2_sp": {"tensor_model_parallel_size": 2, "use_torch_fsdp2": True, "sequence_parallel": True},
    "pp2": {"pipeline_model_parallel_size": 2},
    "ep2": {"expert_model_parallel_size": 2},
    "cp2": {"context_parallel_size": 2, "model": {"cp_comm_type": "all_gather"}},
}
HARNESS_LAYOUTS = {"megatron_fsdp": {"use_megatron_fsdp": True}}
"""Through the Megatron FSDP CPU harness, last: EP=1, the experts and their biases sharded over both ranks."""
REFUSED = {"moe_expert_bias": {"tensor_model_parallel_size": 2, "use_torch_fsdp2": True,
                               "model": {"expert_tensor_parallel_size": 2}}}
GROUPS = {2: ["test_tiny_gpt_oss_trains_on_its_layouts"]}

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def launches(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> LaunchGroups | None:
    """The launch (launching process only), with the path of the one-process reference."""
    if is_worker():
        return None
    env = {"MB_REFERENCE_GPT_OSS": str(cached_reference(tiny_config("tiny_gpt_oss"), tmp_path_factory)),
           "MB_GPT_OSS_DIR": str(tmp_path_factory.mktemp("gpt_oss_resume"))}
    return LaunchGroups(__file__, selected_groups(request, GROUPS), {2: 600}, env=env)


@pytest.mark.support_cells("gpt_oss:ddp", "gpt_oss:fsdp2", "gpt_oss:tp", "gpt_oss:pp", "gpt_oss:ep",
                            "gpt_oss:resume", "gpt_oss:cp", "gpt_oss:megatron_fsdp")
def test_tiny_gpt_oss_trains_on_its_layouts(launches: LaunchGroups | None) -> None:
    if not is_worker():
        launches.check("test_tiny_gpt_oss_trains_on_its_layouts")  # type: ignore[union-attr]
        return
    # the resume at EP=2: the expert biases are saved as EP shards
    run_layouts("tiny_gpt_oss", LAYOUTS, REFUSED, os.environ["MB_REFERENCE_GPT_OSS"],
                Path(os.environ["MB_GPT_OSS_DIR"]), HARNESS_LAYOUTS, expert_model_parallel_size=2)
