"""The megatron-core CPU harness's function mode (tests/functional_tests/mcore_cpu_harness.py): bf16/fp16 matrix
products accumulate in fp32 and are rounded once, everything else reaches torch unchanged. The mode is entered as a
context here; ``install()``, which enters it for the whole process, is left to the functional tests' workers."""

from typing import Any

import pytest
import torch
from torch.overrides import TorchFunctionMode

from tests.functional_tests.mcore_cpu_harness import _CudaToCpu


REDUCED = (torch.bfloat16, torch.float16)


def _operands(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return tuple(torch.randn(shape, generator=g).to(dtype) for shape in ((64, 32), (32, 16), (4, 16, 8)))


class _Recorder(TorchFunctionMode):
    """Below the harness's mode: sees what the harness hands on to torch (function name, operand dtypes)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, tuple[torch.dtype, ...]]] = []

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        dtypes = tuple(a.dtype for a in args if isinstance(a, torch.Tensor))
        self.calls.append((getattr(func, "__name__", str(func)), dtypes))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("dtype", REDUCED)
def test_reduced_precision_products_accumulate_in_fp32_and_round_once(dtype: torch.dtype) -> None:
    a, b, c = _operands(dtype)
    ones = torch.ones(4, 16, 16, dtype=dtype)
    with _Recorder() as recorder, _CudaToCpu():
        products = {"matmul": torch.matmul(a, b), "Tensor.matmul": a.matmul(b), "@": a @ b,
                    "bmm": torch.bmm(c, c.transpose(1, 2)),
                    "baddbmm": torch.baddbmm(ones, c, c.transpose(1, 2), beta=0.5, alpha=0.25)}
    products_seen = [dtypes for name, dtypes in recorder.calls if "mm" in name or "matmul" in name]
    assert len(products_seen) == 5 and all(set(d) == {torch.float32} for d in products_seen), recorder.calls
    up = (a.float() @ b.float()).to(dtype)
    expected = {"matmul": up, "Tensor.matmul": up, "@": up,
                "bmm": torch.bmm(c.float(), c.float().transpose(1, 2)).to(dtype),
                "baddbmm": torch.baddbmm(ones.float(), c.float(), c.float().transpose(1, 2), beta=0.5,
                                         alpha=0.25).to(dtype)}
    for name, product in products.items():
        assert product.dtype == dtype, name
        assert torch.equal(product, expected[name]), name


def test_other_products_reach_torch_unchanged() -> None:
    a, b, _ = _operands(torch.float32)
    mixed = (a.bfloat16(), b)  # mixed dtypes: torch's own error, not a silent upcast
    with _Recorder() as recorder, _CudaToCpu():
        product = torch.matmul(a, b)
        assert recorder.calls[-1] == ("matmul", (torch.float32, torch.float32))
        assert torch.equal(a @ b, product)
        with pytest.raises(RuntimeError):
            torch.matmul(*mixed)
        out = torch.empty(64, 16, dtype=torch.bfloat16)
        torch.matmul(a.bfloat16(), b.bfloat16(), out=out)  # out=: torch's kernel writes it
    assert torch.equal(out, torch.matmul(a.bfloat16(), b.bfloat16()))


def test_cuda_devices_become_the_cpu() -> None:
    with _CudaToCpu():
        made = torch.zeros(3, device="cuda")
        moved = torch.ones(2).to("cuda:0")
        assert torch.ones(2).cuda().device.type == "cpu"
        assert torch.ones(2).type() == "torch.cuda.FloatTensor"
    assert made.device.type == moved.device.type == "cpu"
