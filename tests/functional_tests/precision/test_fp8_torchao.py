"""FP8 training of the local engine through torchao on 2 gloo ranks (one torchrun launch), with
``mixed_precision.fp8_emulate`` (torchao's FP8 casts, high-precision GEMMs: the CPU has no FP8 tensor cores).

bf16 under FSDP2 is the reference. ``bf16_with_fp8_current_scaling_mixed`` then trains under FSDP2 with the FP8
all-gather (``fp8_param_gather``: torchao's ``enable_fsdp_float8_all_gather`` and the scales precomputed after each
optimizer step), under DDP, and with tensor parallelism 2 (DTensor Float8Linear): the converted layers are exactly
the filter's, losses are finite and falling and within FP8_VS_BF16 of bf16 in the same layout, and FP8 under FSDP2
and DDP agree within FP8_LAYOUT_RTOL (the same FP8 casts with global scales; only reduction orders differ)."""

from typing import Any

import pytest
import torch

from megatron_bridge.config.mixed_precision import get_mixed_precision_preset
from megatron_bridge.training.callbacks import Callback
from megatron_bridge.training.pretrain import pretrain
from tests.functional_tests.launcher import TWO_RANKS, is_worker, join_launch_group
from tests.functional_tests.training._common import assert_finite_decreasing, small_config


pytestmark = [pytest.mark.distributed, pytest.mark.timeout(600)]

FP8_VS_BF16 = 0.02
"""Relative loss difference allowed between FP8 (E4M3 weights/activations, E5M2 gradients) and bf16 per step."""
FP8_LAYOUT_RTOL = 2e-3
"""FP8 under FSDP2 (FP8 all-gather) and DDP: same casts and global scales, different reduction orders."""
CONVERTED = [f"layers.{i}.{m}" for i in (1, 2) for m in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                                         "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj",
                                                         "mlp.down_proj")]
"""The tiny Llama's 4 layers minus the first and last (first_last_layers_bf16), without lm_head."""


def _cfg(fp8: bool, **overrides: Any):  # noqa: ANN202
    cfg = small_config(train_iters=4, micro_batch_size=4, seq_length=32, lr=3e-3, lr_warmup_iters=1, **overrides)
    if fp8:
        mp = get_mixed_precision_preset("bf16_with_fp8_current_scaling_mixed")
        mp.fp8_emulate = True
        cfg.mixed_precision = mp
    else:
        cfg.mixed_precision = "bf16_mixed"
    return cfg


class Float8Layers(Callback):
    """What the model looks like when training starts: Float8Linear names, and the FP8 all-gather weight type."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self.fp8_all_gather = False
        self.precompute = False

    def on_train_start(self, ctx: Any) -> None:
        from torchao.float8.float8_linear import Float8Linear
        from torchao.float8.fsdp_utils import WeightWithDynamicFloat8CastTensor

        model = ctx.backend.unwrap(ctx.backend.chunks[0])
        self.names = [n for n, m in model.named_modules() if isinstance(m, Float8Linear)]
        weight = model.layers[1].self_attn.q_proj.weight
        self.fp8_all_gather = isinstance(getattr(weight, "_local_tensor", weight), WeightWithDynamicFloat8CastTensor)
        self.precompute = ctx.fp8.precompute_scales
        assert ctx.fp8.converted == self.names


def _close(a: list[float], b: list[float], rtol: float) -> bool:
    return all(abs(x - y) <= rtol * abs(y) for x, y in zip(a, b, strict=True))


def test_fp8_fsdp2_ddp_tp_against_bf16(request: pytest.FixtureRequest) -> None:
    if not is_worker():
        TWO_RANKS.check(request)
        return
    join_launch_group()  # pretrain reuses the group
    bf16 = pretrain(_cfg(False, use_torch_fsdp2=True)).losses

    layers = Float8Layers()
    fsdp2 = pretrain(_cfg(True, use_torch_fsdp2=True), callbacks=[layers])
    assert fsdp2.backend == "fsdp2" and layers.names == CONVERTED
    assert layers.fp8_all_gather and layers.precompute
    assert_finite_decreasing(fsdp2.losses, min_drop=0.01)
    assert _close(fsdp2.losses, bf16, FP8_VS_BF16), (fsdp2.losses, bf16)

    ddp_layers = Float8Layers()
    ddp = pretrain(_cfg(True), callbacks=[ddp_layers])
    assert ddp.backend == "ddp" and ddp_layers.names == CONVERTED and not ddp_layers.precompute
    assert _close(ddp.losses, fsdp2.losses, FP8_LAYOUT_RTOL), (ddp.losses, fsdp2.losses)

    tp_layout = {"tensor_model_parallel_size": 2, "use_torch_fsdp2": True}  # TP pads the vocabulary differently
    tp_bf16 = pretrain(_cfg(False, **tp_layout)).losses
    tp_layers = Float8Layers()
    tp = pretrain(_cfg(True, **tp_layout), callbacks=[tp_layers])
    assert tp_layers.names == CONVERTED
    assert torch.isfinite(torch.tensor(tp.losses)).all()
    assert _close(tp.losses, tp_bf16, FP8_VS_BF16), (tp.losses, tp_bf16)
