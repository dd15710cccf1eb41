"""The tiny GPT-OSS (attention sinks and biases, a 32-token window on every other layer, YaRN, 8 experts with the
clamped quick-GeGLU, expert and router biases) trains on the parallel layouts the library has for it, each step's loss
within 1e-5 (relative) of one process on the same global batch, and resumes bit-exact at EP=2 (the expert weights
and biases checkpointed as global tensors). One 2-rank torchrun launch runs every case (``pretrain()`` reuses the
launch's process group); the launching process computes the one-process reference.

Layouts, each on 2 gloo ranks: DDP, FSDP2, TP=2 with sequence parallelism (on FSDP2; EP folded over TP: the experts
and their biases whole and replicated on both TP ranks, each routing its half of the tokens), PP=2, EP=2 (the
expert biases sharded with their experts) and CP=2 (all-gather attention: ring attention has no sink column, rule
``attention_sinks``). Refused by name, checked here: Megatron FSDP (rule ``moe_backend``) and
expert tensor parallelism with expert biases (rule ``moe_expert_bias``).
"""

import os
from pathlib import Path
from typing import Any

import pytest

from megatron_bridge.config.container import ConfigContainer
from megatron_bridge.errors import ConfigValidationError
from megatron_bridge.recipes import RECIPES
from tests.functional_tests.launcher import LaunchGroups, is_worker, selected_groups
from tests.functional_tests.training._common import cached_reference


LOSS_RTOL = 1e-5
LAYOUTS: dict[str, dict[str, Any]] = {
    "ddp": {},
    "fsdp2": {"use_torch_fsdp2": True},
    "tp2_sp": {"tensor_model_parallel_size": 2, "use_torch_fsdp2": True, "sequence_parallel": True},
    "pp2": {"pipeline_model_parallel_size": 2},
    "ep2": {"expert_model_parallel_size": 2},
    "cp2": {"context_parallel_size": 2, "model": {"cp_comm_type": "all_gather"}},
}
REFUSED = {"moe_backend": {"use_megatron_fsdp": True},
           "moe_expert_bias": {"tensor_model_parallel_size": 2, "use_torch_fsdp2": True,
                               "model": {"expert_tensor_parallel_size": 2}}}
GROUPS = {2: ["test_tiny_gpt_oss_trains_on_its_layouts"]}

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(600)]


def gpt_oss_config(**layout: Any) -> ConfigContainer:
    """The tiny GPT-OSS at seq 64 (longer than the 32-token window and YaRN's original context): 4 steps of 8
    samples (2 per micro-batch), no eval, no checkpoints, the vocabulary padded to 512 rows at every TP size; one
    process (EP=1) unless ``layout`` says otherwise (a ``model`` entry sets model fields)."""
    model = layout.pop("model", {})
    kwargs = {"train_iters": 4, "global_batch_size": 8, "micro_batch_size": 2, "seq_length": 64,
              "eval_interval": None, "lr_warmup_iters": 1, "log_interval": 1, "expert_model_parallel_size": 1}
    cfg = RECIPES["tiny_gpt_oss"].fn(**{**kwargs, **layout})
    for name, value in model.items():
        setattr(cfg.model, name, value)
    cfg.checkpoint.save = cfg.checkpoint.load = None
    cfg.model.make_vocab_size_divisible_by = 256
    return cfg


@pytest.fixture(scope="module")
def launches(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> LaunchGroups | None:
    """The launch (launching process only), with the path of the one-process reference."""
    if is_worker():
        return None
    env = {"MB_REFERENCE_GPT_OSS": str(cached_reference(gpt_oss_config(), tmp_path_factory)),
           "MB_GPT_OSS_DIR": str(tmp_path_factory.mktemp("gpt_oss_resume"))}
    return LaunchGroups(__file__, selected_groups(request, GROUPS), {2: 600}, env=env)


def _check_layout(name: str, layout: dict[str, Any]) -> None:
    import torch

    from megatron_bridge.training.gpt_step import forward_step
    from megatron_bridge.training.pretrain import pretrain

    want = torch.load(os.environ["MB_REFERENCE_GPT_OSS"], weights_only=True)["losses"].tolist()
    got = pretrain(gpt_oss_config(**dict(layout)), forward_step).losses
    bad = [(g, w) for g, w in zip(got, want, strict=True) if abs(g - w) > LOSS_RTOL * abs(w)]
    assert not bad, f"gpt_oss {name}: losses {got} vs one process {want}"
    if int(os.environ["RANK"]) == 0:
        print(f"[gpt_oss layouts] {name}: max relative loss difference "
              f"{max(abs(g - w) / abs(w) for g, w in zip(got, want, strict=True)):.2e}")


def _check_resume(root: Path) -> None:
    from megatron_bridge.training.gpt_step import forward_step
    from megatron_bridge.training.pretrain import pretrain

    full_cfg = gpt_oss_config(expert_model_parallel_size=2)  # the expert biases saved as EP shards
    full_cfg.checkpoint.save, full_cfg.checkpoint.save_interval = str(root / "gpt_oss"), 2
    full = pretrain(full_cfg, forward_step)
    resumed_cfg = gpt_oss_config(expert_model_parallel_size=2)
    resumed_cfg.checkpoint.load, resumed_cfg.checkpoint.ckpt_step = str(root / "gpt_oss"), 2
    resumed = pretrain(resumed_cfg, forward_step)
    assert resumed.steps == [3, 4] and resumed.losses == full.losses[2:], (full.losses, resumed.losses)


@pytest.mark.support_cells("gpt_oss:ddp", "gpt_oss:fsdp2", "gpt_oss:tp", "gpt_oss:pp", "gpt_oss:ep",
                            "gpt_oss:resume", "gpt_oss:cp", "gpt_oss:megatron_fsdp!moe_backend")
def test_tiny_gpt_oss_trains_on_its_layouts(launches: LaunchGroups | None) -> None:
    if not is_worker():
        launches.check("test_tiny_gpt_oss_trains_on_its_layouts")  # type: ignore[union-attr]
        return
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group("gloo")  # pretrain() reuses the launch's group
    for rule_id, layout in REFUSED.items():
        with pytest.raises(ConfigValidationError, match=rf"\[rule {rule_id}\]"):
            gpt_oss_config(**layout).validate(world_size=2)
    for name, layout in LAYOUTS.items():
        _check_layout(name, layout)
    _check_resume(Path(os.environ["MB_GPT_OSS_DIR"]))
