"""Shared pieces of the 2-rank backend tests: tiny configs, a single-process reference run and a backend run.

Every rank computes the reference itself (a plain model on the whole global batch), so no file exchange is needed:
the backend run (each rank on its slice of the same global batch) must reproduce it. Plain SGD, fp32.
"""

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn

from megatron_bridge.config.container import ConfigContainer
from megatron_bridge.engines.ddp_wrap import ddp_wrap
from megatron_bridge.models import build_model_chunks
from tests.unit_tests.distributed.helpers import SEQ, VOCAB, tiny_cfg  # noqa: F401  (re-exported for tests)


GLOBAL_ROWS, STEPS, LR = 4, 3, 0.5
CPU = torch.device("cpu")
ATOL = 1e-6
"""Parameters after STEPS SGD steps must match the reference within this absolute tolerance (rtol 0)."""


@dataclass
class Case:
    """One backend configuration to compare with the reference."""

    name: str
    configure: Callable[[ConfigContainer], None] = lambda cfg: None
    microbatches: int = 1
    freeze_embedding: bool = False
    extra: dict[str, object] = field(default_factory=dict)


def global_batches() -> list[torch.Tensor]:
    """STEPS global batches ``[GLOBAL_ROWS, SEQ]``, identical on every rank."""
    gen = torch.Generator().manual_seed(1234)
    return [torch.randint(0, VOCAB, (GLOBAL_ROWS, SEQ), generator=gen) for _ in range(STEPS)]


def _build(cfg: ConfigContainer, freeze_embedding: bool, device: torch.device) -> list[nn.Module]:
    torch.manual_seed(0)
    chunks = build_model_chunks(cfg.model, device=device)
    if freeze_embedding:
        chunks[0].embed_tokens.requires_grad_(False)
    return chunks


def reference_run(
    freeze_embedding: bool = False, device: torch.device = CPU
) -> tuple[dict[str, torch.Tensor], list[torch.Tensor]]:
    """Parameters and gradient norms of a plain single-process run on the whole global batches."""
    model = _build(tiny_cfg(), freeze_embedding, device)[0]
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.SGD(params, lr=LR)
    norms = []
    for ids in global_batches():
        ids = ids.to(device)
        model(ids, labels=ids).mean().backward()
        norms.append(torch.nn.utils.clip_grad_norm_(params, float("inf")).detach().cpu())
        opt.step()
        opt.zero_grad(set_to_none=True)
    return {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}, norms


def backend_run(
    cfg: ConfigContainer, case: Case, device: torch.device = CPU
) -> tuple[dict[str, torch.Tensor], list[torch.Tensor]]:
    """The same steps through ``ddp_wrap``: this rank's slice of each global batch, in ``case.microbatches``."""
    backend = ddp_wrap(_build(cfg, case.freeze_embedding, device), cfg, device)
    model = backend.chunks[0]
    opt = torch.optim.SGD(backend.parameters(), lr=LR)
    rank, world = dist.get_rank(), dist.get_world_size()
    norms = []
    for ids in global_batches():
        local = ids.chunk(world)[rank].to(device)
        parts = local.chunk(case.microbatches)
        for i, part in enumerate(parts):
            with backend.grad_sync_context(is_last_microbatch=i == len(parts) - 1):
                with backend.forward_context():
                    loss = model(part, labels=part).mean() / len(parts)
                loss.backward()
        backend.finish_grad_sync()
        norms.append(backend.clip_grad_norm(0.0).cpu())
        opt.step()
        backend.zero_grad(opt)
    state = backend.model_state_dict()["model"]
    full = {k: (v.full_tensor() if hasattr(v, "full_tensor") else v) for k, v in state.items()}
    return {k: v.detach().cpu().clone() for k, v in full.items()}, norms


def compare(case: Case, cfg: ConfigContainer, device: torch.device = CPU, atol: float = ATOL) -> str | None:
    """None when the backend run matches the reference (params ``atol``, norms rtol 1e-5), else a message."""
    ref_state, ref_norms = reference_run(case.freeze_embedding, device)
    state, norms = backend_run(cfg, case, device)
    if state.keys() != ref_state.keys():
        return f"{case.name}: state-dict keys differ: {sorted(state.keys() ^ ref_state.keys())}"
    worst = max(ref_state, key=lambda k: (state[k].float() - ref_state[k].float()).abs().max().item())
    diff = (state[worst].float() - ref_state[worst].float()).abs().max().item()
    if diff > atol:
        return f"{case.name}: max |param - reference| = {diff:.3g} at {worst} (atol {atol})"
    for step, (norm, ref) in enumerate(zip(norms, ref_norms)):
        if not torch.allclose(norm, ref, rtol=1e-5, atol=0):
            return f"{case.name}: grad norm at step {step} is {norm.item()} vs reference {ref.item()}"
    return None


def run_cases(
    cases: list[Case], make_cfg: Callable[[], ConfigContainer], device: torch.device = CPU, atol: float = ATOL
) -> None:
    """Run every case (each builds its own model and backend) and fail once with all mismatches."""
    failures = []
    for case in cases:
        cfg = make_cfg()
        case.configure(cfg)
        try:
            message = compare(case, cfg, device, atol)
        except Exception as exc:
            exc.add_note(f"in case {case.name!r}")
            raise
        if message:
            failures.append(message)
    assert not failures, "\n".join(failures)
