"""A tiny Llama + backend + optimizer + CheckpointManager bundle and a deterministic training loop for the
checkpoint tests (unit tests in one process, functional tests under torchrun)."""

from dataclasses import dataclass

import torch

from megatron_bridge.bridge.converter import PretrainedConverter
from megatron_bridge.checkpoint import CheckpointManager
from megatron_bridge.checkpoint.train_state import TrainState
from megatron_bridge.config.checkpoint import CheckpointConfig
from megatron_bridge.config.container import ConfigContainer
from megatron_bridge.config.model import ModelConfig
from megatron_bridge.distributed.base import DataParallelBackend
from megatron_bridge.engines.ddp_wrap import ddp_wrap
from megatron_bridge.engines.native.optimizer import build_optimizer
from megatron_bridge.models import build_model_chunks
from megatron_bridge.training.lr_schedule import OptimizerParamScheduler
from megatron_bridge.utils.dist_env import get_rank


VOCAB = 100
SEQ = 16


def tiny_cfg(*, backend: str = "ddp", hidden_size: int = 32, num_layers: int = 2, **ckpt: object) -> ConfigContainer:
    """A ~30k-parameter Llama config; ``ckpt`` sets ``cfg.checkpoint`` fields; backend "ddp" or "fsdp2"."""
    model = ModelConfig(num_layers=num_layers, hidden_size=hidden_size, ffn_hidden_size=64, num_attention_heads=4,
                        num_query_groups=2, vocab_size=VOCAB, make_vocab_size_divisible_by=16, seq_length=SEQ)
    cfg = ConfigContainer(model=model, checkpoint=CheckpointConfig(**ckpt))  # type: ignore[arg-type]
    cfg.train.train_iters = 20
    cfg.optimizer.lr = 1e-2
    cfg.scheduler.lr_warmup_iters = 2
    cfg.scheduler.lr_decay_style = "cosine"
    cfg.dist.use_torch_fsdp2 = backend == "fsdp2"
    return cfg


@dataclass
class Run:
    """Everything a training run holds, plus its checkpoint manager."""

    cfg: ConfigContainer
    backend: DataParallelBackend
    optimizer: torch.optim.Optimizer
    scheduler: OptimizerParamScheduler
    state: TrainState
    manager: CheckpointManager


def build_run(cfg: ConfigContainer, seed: int = 0) -> Run:
    """Model (seeded), backend from ``cfg``, AdamW, schedule, TrainState and CheckpointManager."""
    torch.manual_seed(seed)
    chunks = build_model_chunks(cfg.model, device="cpu")
    backend = ddp_wrap(chunks, cfg, torch.device("cpu"))
    optimizer = backend.prepare_optimizer(build_optimizer(cfg, backend.chunks, torch.device("cpu")))
    scheduler = OptimizerParamScheduler(optimizer, cfg)
    state = TrainState()
    manager = CheckpointManager(cfg, backend, optimizer, scheduler, state, converter=PretrainedConverter())
    return Run(cfg, backend, optimizer, scheduler, state, manager)


def batch(step: int, rows: int = 2, rank: int | None = None) -> torch.Tensor:
    """Token ids for ``step`` on ``rank`` (default: this rank); the same on every run."""
    rank = get_rank() if rank is None else rank
    generator = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randint(0, VOCAB, (rows, SEQ), generator=generator)


def train(run: Run, steps: int, *, dropout_rng: bool = True) -> list[float]:
    """``steps`` optimizer steps on :func:`batch` data; returns the losses. With ``dropout_rng`` every step also
    draws from the global torch RNG (like dropout would), so a missed RNG restore changes the losses."""
    losses = []
    for _ in range(steps):
        tokens = batch(run.state.step)
        if dropout_rng:
            tokens = (tokens + torch.randint(0, 2, (1,))) % VOCAB
        run.backend.zero_grad(run.optimizer)
        with run.backend.grad_sync_context(is_last_microbatch=True), run.backend.forward_context():
            loss = run.backend.chunks[0](tokens, labels=tokens).mean()
            loss.backward()
        run.backend.finish_grad_sync()
        run.backend.clip_grad_norm(1.0)
        run.optimizer.step()
        run.scheduler.step()
        run.state.step += 1
        run.state.consumed_train_samples += tokens.shape[0]
        losses.append(loss.item())
    return losses


@torch.no_grad()
def eval_loss(run: Run) -> float:
    """Loss on one fixed batch (the same on every rank and world size)."""
    tokens = batch(9999, rows=4, rank=0)
    with run.backend.forward_context():
        return run.backend.chunks[0](tokens, labels=tokens).mean().item()


def full_weights(run: Run) -> dict[str, torch.Tensor]:
    """The model's full weights (DTensors gathered)."""
    state = run.backend.model_state_dict()["model"]
    return {k: (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().clone() for k, v in state.items()}
