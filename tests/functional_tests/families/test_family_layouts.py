"""The tiny Mistral (a 32-token sliding window on 64-token sequences), Mixtral (8 experts, top-2), Qwen3 (q/k norm),
Qwen3-MoE and Gemma 3 (five 32-token window layers with their own RoPE base to one full layer, post-norms, GeGLU)
train on every parallel layout the library has (and so does the tiny Mistral with learnable attention sinks),
each step's loss within 1e-5 (relative) of one process
on the same global batch, and resume bit-exact. One 2-rank torchrun launch runs every case (``pretrain()`` reuses the
launch's process group); the launching process computes one single-process reference per family.

Layouts, each on 2 gloo ranks: DDP, FSDP2, TP=2 (with FSDP2), PP=2, CP=2 (all-gather
attention with the window), and EP=2 for the mixtures of experts; Megatron FSDP for every family through the CPU
harness (tests/functional_tests/megatron_fsdp_cpu_harness.py, installed last: it makes every collective synchronous),
the experts of the mixtures of experts sharded over the expert-data-parallel group (Mixtral at EP=1: both ranks;
Qwen3-MoE at EP=2: one rank each). Gemma 3's tied embeddings on PP=2: the last stage keeps a copy of the embedding
(megatron_bridge.distributed.tied_embeddings). Resume: DDP trains 4 steps saving at step 2; a second run resumes from
step 2 and its steps 3 and 4 have exactly the losses of the first run.
"""

import os
from pathlib import Path
from typing import Any

import pytest

from megatron_bridge.config.container import ConfigContainer
from megatron_bridge.recipes import RECIPES
from tests.functional_tests.launcher import LaunchGroups, is_worker, selected_groups
from tests.functional_tests.training._common import cached_reference


LOSS_RTOL = 1e-5
FAMILIES: dict[str, tuple[str, dict[str, Any]]] = {
    "mistral": ("tiny_mistral", {}),
    "mixtral": ("tiny_mixtral", {}),
    "qwen3": ("tiny_llama", {"family": "qwen3", "qk_layernorm": True}),
    "qwen3_moe": ("tiny_moe", {"family": "qwen3_moe", "qk_layernorm": True, "expert_tensor_parallel_size": 1}),
    "gemma3": ("tiny_gemma3", {}),
    "sinks": ("tiny_mistral", {"softmax_type": "learnable"}),
}
"""Family → the tiny recipe and the model fields that make it the family's (Qwen3: the tiny Llama with q/k norm);
"sinks" is no family but the shared attention's sinks (GPT-OSS's), on the tiny Mistral's window layers."""
MOE = ("mixtral", "qwen3_moe")
LAYOUTS: dict[str, dict[str, Any]] = {
    "ddp": {},
    "fsdp2": {"use_torch_fsdp2": True},
    "tp2": {"tensor_model_parallel_size": 2, "use_torch_fsdp2": True},
    "pp2": {"pipeline_model_parallel_size": 2},
    "cp2": {"context_parallel_size": 2},
}
EP2 = {"expert_model_parallel_size": 2}
MEGATRON_FSDP = {"use_megatron_fsdp": True}
MOE_MEGATRON_FSDP = {"mixtral": {}, "qwen3_moe": EP2}
"""The mixtures of experts on Megatron FSDP: Mixtral's experts sharded over both ranks (EP=1, expert-data-parallel
size 2), Qwen3-MoE's split over EP=2 (expert-data-parallel size 1)."""
GROUPS = {2: ["test_tiny_families_train_on_every_layout"]}

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(900)]


def family_config(family: str, **layout: Any) -> ConfigContainer:
    """The family's tiny recipe at seq 64: 4 steps of 8 samples (2 per micro-batch), no eval, no checkpoints, the
    vocabulary padded to 512 rows at every TP size; one process (EP=1) unless ``layout`` says otherwise."""
    kwargs = {"train_iters": 4, "global_batch_size": 8, "micro_batch_size": 2, "seq_length": 64,
              "eval_interval": None, "lr_warmup_iters": 1, "log_interval": 1}
    if family in MOE:
        kwargs["expert_model_parallel_size"] = 1
    recipe, fields = FAMILIES[family]
    cfg = RECIPES[recipe].fn(**{**kwargs, **layout})
    for name, value in fields.items():
        setattr(cfg.model, name, value)
    cfg.checkpoint.save = cfg.checkpoint.load = None
    cfg.model.make_vocab_size_divisible_by = 256  # the vocabulary padded alike at TP=1 and TP=2 (512 rows)
    return cfg


@pytest.fixture(scope="module")
def launches(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> LaunchGroups | None:
    """The launch (launching process only), with the path of each family's one-process reference."""
    if is_worker():
        return None
    env = {f"MB_REFERENCE_{f.upper()}": str(cached_reference(family_config(f), tmp_path_factory)) for f in FAMILIES}
    env["MB_FAMILY_DIR"] = str(tmp_path_factory.mktemp("family_resume"))
    return LaunchGroups(__file__, selected_groups(request, GROUPS), {2: 900}, env=env)


def _check_layout(family: str, name: str, layout: dict[str, Any]) -> None:
    import torch

    from megatron_bridge.training.gpt_step import forward_step
    from megatron_bridge.training.pretrain import pretrain

    want = torch.load(os.environ[f"MB_REFERENCE_{family.upper()}"], weights_only=True)["losses"].tolist()
    got = pretrain(family_config(family, **layout), forward_step).losses
    bad = [(g, w) for g, w in zip(got, want, strict=True) if abs(g - w) > LOSS_RTOL * abs(w)]
    assert not bad, f"{family} {name}: losses {got} vs one process {want}"
    if int(os.environ["RANK"]) == 0:
        print(f"[family layouts] {family} {name}: max relative loss difference "
              f"{max(abs(g - w) / abs(w) for g, w in zip(got, want, strict=True)):.2e}")


def _check_resume(family: str, root: Path) -> None:
    from megatron_bridge.training.gpt_step import forward_step
    from megatron_bridge.training.pretrain import pretrain

    full_cfg = family_config(family)
    full_cfg.checkpoint.save, full_cfg.checkpoint.save_interval = str(root / family), 2
    full = pretrain(full_cfg, forward_step)
    resumed_cfg = family_config(family)
    resumed_cfg.checkpoint.load, resumed_cfg.checkpoint.ckpt_step = str(root / family), 2
    resumed = pretrain(resumed_cfg, forward_step)
    assert resumed.steps == [3, 4] and resumed.losses == full.losses[2:], (full.losses, resumed.losses)


@pytest.mark.support_cells("mistral:ddp", "mistral:fsdp2", "mistral:megatron_fsdp", "mistral:tp", "mistral:pp",
                            "mistral:cp", "mistral:resume", "qwen3:ddp", "qwen3:fsdp2", "qwen3:megatron_fsdp",
                            "qwen3:tp", "qwen3:pp", "qwen3:cp", "qwen3:resume", "mixtral:ddp", "mixtral:fsdp2",
                            "mixtral:tp", "mixtral:pp", "mixtral:cp", "mixtral:ep", "mixtral:resume",
                            "mixtral:megatron_fsdp", "qwen3_moe:ddp", "qwen3_moe:fsdp2", "qwen3_moe:tp",
                            "qwen3_moe:pp", "qwen3_moe:cp", "qwen3_moe:ep", "qwen3_moe:resume",
                            "qwen3_moe:megatron_fsdp", "gemma3:ddp", "gemma3:fsdp2", "gemma3:tp",
                            "gemma3:pp", "gemma3:cp", "gemma3:resume", "gemma3:megatron_fsdp")
def test_tiny_families_train_on_every_layout(launches: LaunchGroups | None) -> None:
    if not is_worker():
        launches.check("test_tiny_families_train_on_every_layout")  # type: ignore[union-attr]
        return
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group("gloo")  # pretrain() reuses the launch's group
    for family in FAMILIES:
        for name, layout in LAYOUTS.items():
            _check_layout(family, name, layout)
        _check_resume(family, Path(os.environ["MB_FAMILY_DIR"]))
    for family in MOE:
        _check_layout(family, "ep2", EP2)
    from tests.functional_tests.megatron_fsdp_cpu_harness import install

    install()  # last: every collective synchronous from here on
    for family in FAMILIES:
        _check_layout(family, "megatron_fsdp", {**MEGATRON_FSDP, **MOE_MEGATRON_FSDP.get(family, {})})
