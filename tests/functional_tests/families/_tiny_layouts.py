"""The shared body of the one-launch layout tests of a tiny family recipe (``test_deepseek_v3_layouts.py``,
``test_gpt_oss_layouts.py``): the recipe at seq 64 for a few steps, each layout's per-step losses against the
one-process reference, the named refusals, and a bit-exact resume."""

import os
from pathlib import Path
from typing import Any

import pytest

from megatron_bridge.config.container import ConfigContainer
from megatron_bridge.errors import ConfigValidationError
from megatron_bridge.recipes import RECIPES


LOSS_RTOL = 1e-5


def tiny_config(recipe: str, **layout: Any) -> ConfigContainer:
    """Tiny recipe ``recipe`` at seq 64: 4 steps of 8 samples (2 per micro-batch), no eval, no checkpoints, the
    vocabulary padded to 512 rows at every TP size; one process (EP=1) unless ``layout`` says otherwise (a ``model``
    entry sets model fields)."""
    model = layout.pop("model", {})
    kwargs = {"train_iters": 4, "global_batch_size": 8, "micro_batch_size": 2, "seq_length": 64,
              "eval_interval": None, "lr_warmup_iters": 1, "log_interval": 1, "expert_model_parallel_size": 1}
    cfg = RECIPES[recipe].fn(**{**kwargs, **layout})
    for name, value in model.items():
        setattr(cfg.model, name, value)
    cfg.checkpoint.save = cfg.checkpoint.load = None
    cfg.model.make_vocab_size_divisible_by = 256
    return cfg


def check_layout(recipe: str, name: str, layout: dict[str, Any], reference: str) -> None:
    """Worker: ``recipe`` trained with ``layout`` gives the one-process losses saved at ``reference`` per step."""
    import torch

    from megatron_bridge.training.gpt_step import forward_step
    from megatron_bridge.training.pretrain import pretrain

    want = torch.load(reference, weights_only=True)["losses"].tolist()
    got = pretrain(tiny_config(recipe, **dict(layout)), forward_step).losses
    bad = [(g, w) for g, w in zip(got, want, strict=True) if abs(g - w) > LOSS_RTOL * abs(w)]
    assert not bad, f"{recipe} {name}: losses {got} vs one process {want}"
    if int(os.environ["RANK"]) == 0:
        print(f"[{recipe} layouts] {name}: max relative loss difference "
              f"{max(abs(g - w) / abs(w) for g, w in zip(got, want, strict=True)):.2e}")


def check_resume(recipe: str, root: Path, **layout: Any) -> None:
    """Worker: a run saved at step 2 and resumed there gives the uninterrupted run's losses bit for bit."""
    from megatron_bridge.training.gpt_step import forward_step
    from megatron_bridge.training.pretrain import pretrain

    full_cfg = tiny_config(recipe, **layout)
    full_cfg.checkpoint.save, full_cfg.checkpoint.save_interval = str(root / recipe), 2
    full = pretrain(full_cfg, forward_step)
    resumed_cfg = tiny_config(recipe, **layout)
    resumed_cfg.checkpoint.load, resumed_cfg.checkpoint.ckpt_step = str(root / recipe), 2
    resumed = pretrain(resumed_cfg, forward_step)
    assert resumed.steps == [3, 4] and resumed.losses == full.losses[2:], (full.losses, resumed.losses)


def run_layouts(recipe: str, layouts: dict[str, dict[str, Any]], refused: dict[str, dict[str, Any]],
                reference: str, resume_root: Path, harness_layouts: dict[str, dict[str, Any]] | None = None,
                **resume_layout: Any) -> None:
    """Worker body of a family's layout test: every refusal by its rule, every layout, the resume, then the
    ``harness_layouts`` (Megatron FSDP) through the CPU harness (tests/functional_tests/megatron_fsdp_cpu_harness.py,
    installed last: it makes every collective synchronous)."""
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group("gloo")  # pretrain() reuses the launch's group
    for rule_id, layout in refused.items():
        with pytest.raises(ConfigValidationError, match=rf"\[rule {rule_id}\]"):
            tiny_config(recipe, **layout).validate(world_size=2)
    for name, layout in layouts.items():
        check_layout(recipe, name, layout, reference)
    check_resume(recipe, resume_root, **resume_layout)
    if harness_layouts:
        from tests.functional_tests.megatron_fsdp_cpu_harness import install

        install()
        for name, layout in harness_layouts.items():
            check_layout(recipe, name, layout, reference)
