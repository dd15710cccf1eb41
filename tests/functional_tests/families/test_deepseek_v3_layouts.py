"""The tiny DeepSeek-V3 (multi-latent attention with YaRN, a dense first layer, 8 experts in 4 groups with the expert
bias and a shared expert) trains on the parallel layouts the library has for it, each step's loss within 1e-5
(relative) of one process on the same global batch, and resumes bit-exact. One 2-rank torchrun launch runs every case
(``pretrain()`` reuses the launch's process group); the launching process computes the one-process reference.

Layouts, each on 2 gloo ranks: DDP, FSDP2 with full activation recompute, TP=2 with sequence parallelism (on FSDP2, as
the backend rule asks; the MLA heads split, the latent projections replicated), PP=2, EP=2 and CP=2 (all-gather
attention, the queries pre-scaled to MLA's softmax scale). Refused by name, checked here: Megatron FSDP (rule
``moe_backend``: it does not shard the native experts yet).
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
    "fsdp2_recompute": {"use_torch_fsdp2": True, "model": {"recompute_granularity": "full",
                                                           "recompute_method": "uniform", "recompute_num_layers": 1}},
    "tp2_sp": {"tensor_model_parallel_size": 2, "use_torch_fsdp2": True, "sequence_parallel": True},
    "pp2": {"pipeline_model_parallel_size": 2},
    "ep2": {"expert_model_parallel_size": 2},
    "cp2": {"context_parallel_size": 2},
}
REFUSED = {"moe_backend": {"use_megatron_fsdp": True}}
GROUPS = {2: ["test_tiny_deepseek_v3_trains_on_its_layouts"]}

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(600)]


def deepseek_config(**layout: Any) -> ConfigContainer:
    """The tiny DeepSeek-V3 at seq 64 (YaRN's original context is 32): 4 steps of 8 samples (2 per micro-batch), no
    eval, no checkpoints, the vocabulary padded to 512 rows at every TP size; one process (EP=1) unless ``layout``
    says otherwise (a ``model`` entry sets model fields)."""
    model = layout.pop("model", {})
    kwargs = {"train_iters": 4, "global_batch_size": 8, "micro_batch_size": 2, "seq_length": 64,
              "eval_interval": None, "lr_warmup_iters": 1, "log_interval": 1, "expert_model_parallel_size": 1}
    cfg = RECIPES["tiny_deepseek_v3"].fn(**{**kwargs, **layout})
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
    env = {"MB_REFERENCE_DEEPSEEK_V3": str(cached_reference(deepseek_config(), tmp_path_factory)),
           "MB_DEEPSEEK_DIR": str(tmp_path_factory.mktemp("deepseek_resume"))}
    return LaunchGroups(__file__, selected_groups(request, GROUPS), {2: 600}, env=env)


def _check_layout(name: str, layout: dict[str, Any]) -> None:
    import torch

    from megatron_bridge.training.gpt_step import forward_step
    from megatron_bridge.training.pretrain import pretrain

    want = torch.load(os.environ["MB_REFERENCE_DEEPSEEK_V3"], weights_only=True)["losses"].tolist()
    got = pretrain(deepseek_config(**dict(layout)), forward_step).losses
    bad = [(g, w) for g, w in zip(got, want, strict=True) if abs(g - w) > LOSS_RTOL * abs(w)]
    assert not bad, f"deepseek_v3 {name}: losses {got} vs one process {want}"
    if int(os.environ["RANK"]) == 0:
        print(f"[deepseek_v3 layouts] {name}: max relative loss difference "
              f"{max(abs(g - w) / abs(w) for g, w in zip(got, want, strict=True)):.2e}")


def _check_resume(root: Path) -> None:
    from megatron_bridge.training.gpt_step import forward_step
    from megatron_bridge.training.pretrain import pretrain

    full_cfg = deepseek_config()
    full_cfg.checkpoint.save, full_cfg.checkpoint.save_interval = str(root / "deepseek_v3"), 2
    full = pretrain(full_cfg, forward_step)
    resumed_cfg = deepseek_config()
    resumed_cfg.checkpoint.load, resumed_cfg.checkpoint.ckpt_step = str(root / "deepseek_v3"), 2
    resumed = pretrain(resumed_cfg, forward_step)
    assert resumed.steps == [3, 4] and resumed.losses == full.losses[2:], (full.losses, resumed.losses)


@pytest.mark.support_cells("deepseek_v3:ddp", "deepseek_v3:fsdp2", "deepseek_v3:tp", "deepseek_v3:pp",
                            "deepseek_v3:ep", "deepseek_v3:resume", "deepseek_v3:cp",
                            "deepseek_v3:megatron_fsdp!moe_backend")
def test_tiny_deepseek_v3_trains_on_its_layouts(launches: LaunchGroups | None) -> None:
    if not is_worker():
        launches.check("test_tiny_deepseek_v3_trains_on_its_layouts")  # type: ignore[union-attr]
        return
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group("gloo")  # pretrain() reuses the launch's group
    for rule_id, layout in REFUSED.items():
        with pytest.raises(ConfigValidationError, match=rf"\[rule {rule_id}\]"):
            deepseek_config(**layout).validate(world_size=2)
    for name, layout in LAYOUTS.items():
        _check_layout(name, layout)
    _check_resume(Path(os.environ["MB_DEEPSEEK_DIR"]))
