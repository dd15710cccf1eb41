"""``DataParallelBackend.optimizer_step``: unscale (fp16 loss scaling), clip, step — the order the loop relies on."""

import torch
from torch import nn

from megatron_bridge.config.container import ConfigContainer
from megatron_bridge.distributed.base import DataParallelBackend


class _Plain(DataParallelBackend):
    name = "plain"

    def wrap(self, model_chunks: list[nn.Module]) -> list[nn.Module]:
        self.chunks = list(model_chunks)
        return self.chunks


def _setup(scale: float | None):  # noqa: ANN202
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    backend = _Plain(ConfigContainer(), torch.device("cpu"))
    backend.wrap([model])
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss = model(torch.randn(8, 4)).pow(2).mean()
    scaler = torch.amp.GradScaler("cpu", init_scale=scale) if scale is not None else None
    (scaler.scale(loss) if scaler is not None else loss).backward()
    return model, backend, opt, scaler


def test_scaled_step_equals_the_unscaled_one() -> None:
    ref_model, ref_backend, ref_opt, _ = _setup(None)
    ref_norm = ref_backend.optimizer_step(ref_opt, max_norm=0.5)
    model, backend, opt, scaler = _setup(1024.0)
    norm = backend.optimizer_step(opt, max_norm=0.5, grad_scaler=scaler)
    assert abs(norm - ref_norm) <= 1e-5 * ref_norm and ref_norm > 0.5  # the norm before clipping, unscaled
    for p, q in zip(model.parameters(), ref_model.parameters()):
        assert torch.allclose(p, q, atol=1e-6)


def test_inf_gradients_skip_the_step_and_lower_the_scale() -> None:
    model, backend, opt, scaler = _setup(1024.0)
    before = [p.detach().clone() for p in model.parameters()]
    next(model.parameters()).grad[0, 0] = float("inf")
    backend.optimizer_step(opt, max_norm=1.0, grad_scaler=scaler)
    assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before))
    assert scaler.get_scale() < 1024.0
