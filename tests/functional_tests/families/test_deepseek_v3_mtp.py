"""The tiny DeepSeek-V3 with one multi-token prediction depth (``model.mtp_num_layers=1``, megatron-core's loss
weight 0.1): it trains (the loss and the logged ``mtp_1 loss`` fall), resumes bit-exact, and runs on 2 gloo ranks
with EP=2 on DDP (the MTP layer's experts split too) and FSDP2 with full activation recompute within 1e-5 (relative)
per step of one process; pipeline, tensor and context parallelism are refused by rule ``multi_token_prediction``."""

import os
from pathlib import Path
from typing import Any

import pytest

from tests.functional_tests.families._tiny_layouts import run_layouts, tiny_config
from tests.functional_tests.launcher import LaunchGroups, is_worker, selected_groups
from tests.functional_tests.training._common import cached_reference


MTP = {"mtp_num_layers": 1}
LAYOUTS: dict[str, dict[str, Any]] = {
    "fsdp2_recompute": {"use_torch_fsdp2": True, "model": {**MTP, "recompute_granularity": "full",
                                                           "recompute_method": "uniform", "recompute_num_layers": 1}},
    "ep2": {"expert_model_parallel_size": 2, "model": MTP},
}
REFUSED = {"multi_token_prediction": {"pipeline_model_parallel_size": 2, "model": MTP}}
GROUPS = {2: ["test_tiny_deepseek_v3_with_mtp_on_two_ranks"]}

pytestmark = [pytest.mark.timeout(600)]


def test_tiny_deepseek_v3_with_mtp_trains_and_resumes_bit_exact(tmp_path: Path) -> None:
    from megatron_bridge.training.gpt_step import forward_step
    from megatron_bridge.training.pretrain import pretrain

    def config(**changes: Any):  # noqa: ANN202
        cfg = tiny_config("tiny_deepseek_v3", train_iters=8, model=dict(MTP))
        cfg.optimizer.lr = 3e-3
        cfg.checkpoint.save, cfg.checkpoint.save_interval = str(tmp_path / "ck"), 4
        for name, value in changes.items():
            setattr(cfg.checkpoint, name, value)
        return cfg

    full = pretrain(config(), forward_step)
    mtp = full.mtp_losses["mtp_1 loss"]
    assert len(mtp) == len(full.losses) == 8
    assert full.losses[-1] < full.losses[0] - 0.5, full.losses
    assert mtp[-1] < mtp[0] - 0.3, mtp  # 6.28 -> 5.79 when written
    assert all(m > 0 for m in mtp) and mtp != full.losses

    resumed = pretrain(config(save=str(tmp_path / "ck2"), load=str(tmp_path / "ck"), ckpt_step=4), forward_step)
    assert resumed.steps == [5, 6, 7, 8]
    assert resumed.losses == full.losses[4:], (full.losses, resumed.losses)
    assert resumed.mtp_losses["mtp_1 loss"] == mtp[4:]


@pytest.fixture(scope="module")
def launches(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> LaunchGroups | None:
    """The launch (launching process only), with the path of the one-process reference with MTP."""
    if is_worker():
        return None
    env = {"MB_REFERENCE_DEEPSEEK_MTP": str(cached_reference(tiny_config("tiny_deepseek_v3", model=dict(MTP)),
                                                             tmp_path_factory)),
           "MB_DEEPSEEK_MTP_DIR": str(tmp_path_factory.mktemp("deepseek_mtp_resume"))}
    return LaunchGroups(__file__, selected_groups(request, GROUPS), {2: 600}, env=env)


@pytest.mark.distributed
def test_tiny_deepseek_v3_with_mtp_on_two_ranks(launches: LaunchGroups | None) -> None:
    if not is_worker():
        launches.check("test_tiny_deepseek_v3_with_mtp_on_two_ranks")  # type: ignore[union-attr]
        return
    run_layouts("tiny_deepseek_v3", LAYOUTS, REFUSED, os.environ["MB_REFERENCE_DEEPSEEK_MTP"],
                Path(os.environ["MB_DEEPSEEK_MTP_DIR"]), expert_model_parallel_size=2, model=dict(MTP))
