"""Tied input/output embeddings under pipeline parallelism (native engine) on gloo: parity with one process.

The tiny Llama with ``model.share_embeddings_and_output_weights=True`` at PP=2: the last stage keeps a copy of the
embedding as its output weight, the two gradients are summed over the first and last stage
(:mod:`megatron_bridge.distributed.tied_embeddings`). Every run's per-step losses (relative 1e-5) and final weights
(absolute 1e-5) match a one-process PP=1 run on the same global batches, and the two copies of the embedding are bitwise
equal at the end. One 2-rank launch runs DDP (1F1B and Interleaved1F1B with VP=2), FSDP2 (1F1B and InterleavedZeroBubble
with VP=2), meta-device initialization (the copy set from the first stage), a bit-exact resume at PP=2, a PP=2
checkpoint resumed at PP=1 and exported to Hugging Face; one 4-rank launch runs PP=4 (the embedding groups are pairs of
the first and last stage), PP=2 × DP=2 (FSDP2 shards), PP=2 × TP=2 (the last stage's TiedOutput over its vocabulary-
parallel copy) and the tiny MoE at PP=2 × EP=2.
"""

import os
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

from megatron_bridge.config.container import ConfigContainer
from megatron_bridge.training.callbacks import Callback
from tests.functional_tests.launcher import LaunchGroups, is_worker, selected_groups
from tests.functional_tests.training._common import cached_reference, max_weight_diff, small_config


LOSS_RTOL = 1e-5
WEIGHT_ATOL = 1e-5
STEPS = 4
EMBEDDING = "embed_tokens.weight"
GROUPS = {2: ["test_tied_pp2_matches_one_process", "test_tied_pp2_resumes"], 4: ["test_tied_four_ranks"]}

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(900)]


def tied_config(model: dict[str, Any] | None = None, **overrides: Any) -> ConfigContainer:
    """The tiny Llama, tied, 4 steps of 8 samples (micro-batch 2), vocabulary 512, no eval, no checkpoints; ``model``
    sets model fields."""
    cfg = small_config(**{"train_iters": STEPS, "log_interval": 1, **overrides})
    for name, value in (model or {}).items():
        setattr(cfg.model, name, value)
    cfg.model.vocab_size, cfg.model.make_vocab_size_divisible_by = 512, 128
    cfg.model.share_embeddings_and_output_weights = True
    return cfg


def tied_moe_config(**layout: Any) -> ConfigContainer:
    """The tiny mixture of experts (tests/functional_tests/families/_tiny_layouts.py), tied."""
    from tests.functional_tests.families._tiny_layouts import tiny_config

    cfg = tiny_config("tiny_moe", **layout)
    cfg.model.share_embeddings_and_output_weights = True
    return cfg


class StageWeights(Callback):
    """Full weights of every stage at the end of training, by rank (DTensors gathered), on every rank."""

    def __init__(self) -> None:
        self.by_rank: list[dict[str, torch.Tensor]] = []

    def on_train_end(self, ctx: Any) -> None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        local: dict[str, torch.Tensor] = {}
        for chunk in ctx.backend.chunks:
            state = get_model_state_dict(chunk, options=StateDictOptions(full_state_dict=True))
            local.update({k: v.detach().cpu().clone() for k, v in state.items()})
        self.by_rank = [{} for _ in range(dist.get_world_size())]
        dist.all_gather_object(self.by_rank, local)


@pytest.fixture(scope="module")
def launches(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> LaunchGroups | None:
    if is_worker():
        return None
    env = {"MB_REFERENCE": str(cached_reference(tied_config(), tmp_path_factory)),
           "MB_REFERENCE_MOE": str(cached_reference(tied_moe_config(), tmp_path_factory)),
           "MB_TIED_DIR": str(tmp_path_factory.mktemp("tied_pp"))}
    return LaunchGroups(__file__, selected_groups(request, GROUPS), {2: 900, 4: 900}, env=env)


def _join_group() -> None:
    if not dist.is_initialized():
        dist.init_process_group("gloo")  # pretrain() reuses the launch's group


class SpoilTheCopy(Callback):
    """Before training: zero the last stage's copy of the embedding, then broadcast the first stage's again (what
    ``wrap`` does after initialization); the copy must hold the first stage's values again."""

    @torch.no_grad()
    def on_train_start(self, ctx: Any) -> None:
        tied = ctx.backend.tied_embeddings
        local = tied.weight.to_local() if hasattr(tied.weight, "to_local") else tied.weight
        if tied.is_copy:
            local.zero_()
        tied.broadcast_weight()
        assert local.abs().sum() > 0, "the copy was not set from the first stage"


def _train(label: str, *, meta: bool = False, **overrides: Any) -> StageWeights:
    """Worker: train at ``overrides``; the embedding's copies on the two stages are bitwise equal at the end."""
    from megatron_bridge.training.pretrain import pretrain

    _join_group()
    cfg = tied_config(**overrides)
    cfg.model.init_model_with_meta_device = meta
    weights = StageWeights()
    result = pretrain(cfg, callbacks=[weights, *([SpoilTheCopy()] if meta else [])])
    first, last = weights.by_rank[0], weights.by_rank[-1]
    assert EMBEDDING in first and EMBEDDING in last, label
    assert torch.equal(first[EMBEDDING], last[EMBEDDING]), f"{label}: the stages' embeddings differ"
    weights.losses = result.losses  # type: ignore[attr-defined]
    return weights


def _check_parity(label: str, **overrides: Any) -> None:
    ref = torch.load(os.environ["MB_REFERENCE"], weights_only=True)
    run = _train(label, **overrides)
    want, got = ref["losses"].tolist(), run.losses  # type: ignore[attr-defined]
    assert all(abs(g - w) <= LOSS_RTOL * abs(w) for g, w in zip(got, want, strict=True)), (label, got, want)
    merged = {k: v for part in run.by_rank for k, v in part.items()}
    diff = max_weight_diff(merged, ref["weights"])
    assert diff <= WEIGHT_ATOL, f"{label}: max weight difference {diff} > {WEIGHT_ATOL}"
    if dist.get_rank() == 0:
        rel = max(abs(g - w) / abs(w) for g, w in zip(got, want, strict=True))
        print(f"[tied pp] {label}: max relative loss difference {rel:.2e}, max weight difference {diff:.2e}")


def test_tied_pp2_matches_one_process(launches: LaunchGroups | None) -> None:
    """PP=2 with DDP (1F1B; Interleaved1F1B at VP=2) and with FSDP2 (1F1B; InterleavedZeroBubble at VP=2, which
    splits the backward) matches one process; meta-device
    initialization gives the last stage the first stage's embedding (broadcast again after spoiling the copy)."""
    if not is_worker():
        launches.check("test_tied_pp2_matches_one_process")  # type: ignore[union-attr]
        return
    _check_parity("PP2 1F1B DDP", pipeline_model_parallel_size=2)
    _check_parity("PP2 VP2 Interleaved1F1B DDP", pipeline_model_parallel_size=2,
                  virtual_pipeline_model_parallel_size=2)
    _check_parity("PP2 VP2 InterleavedZeroBubble FSDP2", pipeline_model_parallel_size=2,
                  virtual_pipeline_model_parallel_size=2, use_torch_fsdp2=True,
                  model={"pipeline_schedule": "InterleavedZeroBubble"})
    _train("PP2 FSDP2 meta-device init", meta=True, pipeline_model_parallel_size=2, use_torch_fsdp2=True)


def _resume_run(root: Path, load_step: int | None, **layout: Any) -> list[float]:
    from megatron_bridge.training.pretrain import pretrain

    _join_group()
    cfg = tied_config(**layout)
    if load_step is None:
        cfg.checkpoint.save, cfg.checkpoint.save_interval = str(root), 2
    else:
        cfg.checkpoint.load, cfg.checkpoint.ckpt_step = str(root), load_step
    result = pretrain(cfg)
    assert result.steps == ([1, 2, 3, 4] if load_step is None else [3, 4]), result.steps
    return result.losses


def _check_hf_export(root: Path, out: Path) -> None:
    from safetensors.torch import load_file

    from megatron_bridge.bridge.auto_bridge import AutoBridge
    from megatron_bridge.bridge.checkpoints import CheckpointTensors

    AutoBridge.export_ckpt(root, out / "hf", step=2)
    hf: dict[str, torch.Tensor] = {}
    for path in sorted((out / "hf").glob("*.safetensors")):
        hf.update(load_file(path))
    saved = dict(CheckpointTensors(root, 2).items())
    assert "lm_head.weight" not in hf and len(hf) == len(saved), sorted(hf)
    assert torch.equal(hf["model.embed_tokens.weight"], saved[EMBEDDING])


def test_tied_pp2_resumes(launches: LaunchGroups | None, tmp_path: Path) -> None:
    """A PP=2 run saved at step 2 resumes at PP=2 bit for bit, and at PP=1 (DP=2) within 1e-5; the PP=2 checkpoint
    exports to a tied Hugging Face folder (one embedding, no ``lm_head.weight``) holding the checkpoint's values."""
    if not is_worker():
        launches.check("test_tied_pp2_resumes")  # type: ignore[union-attr]
        _check_hf_export(Path(launches.env["MB_TIED_DIR"]) / "resume", tmp_path)  # type: ignore[union-attr]
        return
    root = Path(os.environ["MB_TIED_DIR"]) / "resume"
    full = _resume_run(root, None, pipeline_model_parallel_size=2)
    assert _resume_run(root, 2, pipeline_model_parallel_size=2) == full[2:], full
    at_pp1 = _resume_run(root, 2)
    assert all(abs(g - w) <= LOSS_RTOL * abs(w) for g, w in zip(at_pp1, full[2:], strict=True)), (at_pp1, full)


def test_tied_four_ranks(launches: LaunchGroups | None) -> None:
    """PP=4 (DDP), PP=2 × FSDP2 DP=2 and PP=2 × TP=2 (FSDP2) match one process; so does the tied mixture of
    experts at PP=2 × EP=2 (the expert-parallel gradient clipping counts the tied weight once), per-step losses."""
    if not is_worker():
        launches.check("test_tied_four_ranks")  # type: ignore[union-attr]
        return
    _check_parity("PP4 1F1B DDP", pipeline_model_parallel_size=4)
    _check_parity("PP2 x FSDP2 DP2", pipeline_model_parallel_size=2, use_torch_fsdp2=True)
    _check_parity("PP2 x TP2 (FSDP2)", pipeline_model_parallel_size=2, tensor_model_parallel_size=2,
                  use_torch_fsdp2=True)
    from megatron_bridge.training.gpt_step import forward_step
    from megatron_bridge.training.pretrain import pretrain

    want = torch.load(os.environ["MB_REFERENCE_MOE"], weights_only=True)["losses"].tolist()
    got = pretrain(tied_moe_config(pipeline_model_parallel_size=2, expert_model_parallel_size=2), forward_step).losses
    assert all(abs(g - w) <= LOSS_RTOL * abs(w) for g, w in zip(got, want, strict=True)), (got, want)
