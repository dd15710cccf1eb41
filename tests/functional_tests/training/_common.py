"""Shared pieces of the pretrain functional tests: a small config, a callback collecting full weights, references."""

import math
import os
from pathlib import Path
from typing import Any

import torch

from megatron_bridge.config.container import ConfigContainer
from megatron_bridge.recipes import tiny_llama_pretrain_config
from megatron_bridge.training.callbacks import Callback


def small_config(**overrides: Any) -> ConfigContainer:
    """The tiny Llama at seq 64, 8 steps of 8 samples (2 per micro-batch), no eval, no checkpoints."""
    base = {"train_iters": 8, "global_batch_size": 8, "micro_batch_size": 2, "seq_length": 64,
            "eval_interval": None, "lr_warmup_iters": 2, "log_interval": 4}
    kwargs = {**base, **overrides}
    cfg = tiny_llama_pretrain_config(**kwargs)
    cfg.checkpoint.save = cfg.checkpoint.load = None
    return cfg


class FullWeights(Callback):
    """Gathers the full (unsharded) model weights to CPU at the end of training (rank 0 keeps them)."""

    def __init__(self) -> None:
        self.weights: dict[str, torch.Tensor] = {}

    def on_train_end(self, ctx: Any) -> None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        state = get_model_state_dict(ctx.backend.chunks[0], options=options)
        self.weights = {k: v.detach().clone() for k, v in state.items()}


def assert_finite_decreasing(losses: list[float], min_drop: float = 0.05) -> None:
    """Every loss is finite and the last is clearly below the first."""
    assert losses and all(math.isfinite(x) for x in losses), losses
    assert losses[-1] < losses[0] - min_drop, f"loss did not fall: {losses}"


def run_reference(cfg: ConfigContainer, folder: Path) -> Path:
    """Train ``cfg`` in this (single) process and write its losses and full weights to ``folder/reference.pt`` for
    workers to compare against (see :func:`assert_matches_reference`)."""
    from megatron_bridge.training.pretrain import pretrain

    weights = FullWeights()
    result = pretrain(cfg, callbacks=[weights])
    path = folder / "reference.pt"
    torch.save({"losses": torch.tensor(result.losses, dtype=torch.float64), "weights": weights.weights}, path)
    return path


def cached_reference(cfg: ConfigContainer, tmp_path_factory: Any) -> Path:
    """:func:`run_reference` once per pytest session for equal configs (test files whose references share a config
    share one run): kept in the session's base temp folder under the config's digest (its YAML's SHA-256)."""
    from megatron_bridge.training.job import config_digest

    folder = tmp_path_factory.getbasetemp() / f"reference-{config_digest(cfg)[:16]}"
    if (folder / "reference.pt").exists():
        return folder / "reference.pt"
    folder.mkdir(parents=True, exist_ok=True)
    return run_reference(cfg, folder)


def load_reference(env: str = "MB_REFERENCE") -> dict[str, Any]:
    """The reference written by the launching process (path in the environment variable ``env``)."""
    return torch.load(os.environ[env], weights_only=True)


def max_weight_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """Largest absolute difference over all tensors (the key sets must match)."""
    assert sorted(a) == sorted(b), (sorted(set(a) ^ set(b)))
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)


def assert_matches_reference(result: Any, weights: dict[str, torch.Tensor], *, loss_rtol: float, weight_atol: float,
                             label: str, reference_env: str = "MB_REFERENCE") -> None:
    """Losses (every rank) and full weights (rank 0) of a distributed run equal the reference whose path is in the
    environment variable ``reference_env``."""
    ref = load_reference(reference_env)
    for got, want in zip(result.losses, ref["losses"].tolist(), strict=True):
        assert abs(got - want) <= loss_rtol * abs(want), (result.losses, ref["losses"].tolist())
    if int(os.environ["RANK"]) == 0:
        diff = max_weight_diff(weights, ref["weights"])
        assert diff <= weight_atol, f"max weight difference {diff} > {weight_atol}"
        print(f"[parity] {label}: max weight diff {diff:.3e}, losses {result.losses}")
