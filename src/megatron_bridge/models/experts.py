"""The routed experts of an MoE layer (:mod:`megatron_bridge.models.moe`): stacked gated experts computed as grouped
matmuls, with GPT-OSS's clamp, offset, quick-GELU gate and biases, and the autograd helpers the layer's parallel forms
use."""

from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor
from torch.nn import functional as F

from megatron_bridge.config.model import ModelConfig
from megatron_bridge.errors import ConfigValidationError


class SumGradOver(torch.autograd.Function):
    """Identity whose backward sums the gradient over ``group`` (a weight replicated over a group whose ranks see
    different tokens)."""

    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
        ctx.group = group  # type: ignore[attr-defined]
        return x.view_as(x)

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        total = grad.contiguous().clone()
        dist.all_reduce(total, group=ctx.group)  # type: ignore[attr-defined]
        return total, None


def local_tensor(weight: torch.Tensor) -> torch.Tensor:
    """The local tensor of a DTensor (a weight replicated over the TP mesh, a pipeline stage's sharded embedding), else
    the tensor itself."""
    return weight.to_local() if isinstance(weight, DTensor) else weight


def num_experts_of(config: ModelConfig) -> int:
    if config.num_moe_experts is None:
        raise ConfigValidationError("an MoE layer needs model.num_moe_experts (got None)", ("model.num_moe_experts",))
    return config.num_moe_experts


class SumOver(torch.autograd.Function):
    """All-reduce (sum) over ``group`` whose backward passes the gradient through (partial outputs of a weight split
    over the group, whose consumers are replicated over it)."""

    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
        total = x.contiguous().clone()
        dist.all_reduce(total, group=group)
        return total

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad, None


class GroupedExperts(nn.Module):
    """The routed gated experts of one layer as stacked weights ``[E_local, ...]`` (module docstring), with their
    biases under ``add_bias_linear`` (rule ``moe_expert_bias`` keeps them whole per expert: ETP 1).

    Expert parallelism keeps only this rank's experts: ``num_local_experts`` of them, global ids
    ``expert_offset .. expert_offset + num_local_experts - 1``. Expert tensor parallelism (``tp_group`` set,
    ``expert_tensor_parallel_size`` = TP) keeps the rank's part of the ``F`` dimension of every expert (gate/up
    column-wise, down row-wise): the input's gradient and the output are summed over the group.
    """

    def __init__(self, config: ModelConfig, *, dtype: torch.dtype) -> None:
        super().__init__()
        e, h, f = num_experts_of(config), config.hidden_size, config.expert_ffn_hidden_size
        self.num_experts = e
        self.num_local_experts = e
        self.expert_offset = 0
        self.grouped_gemm = config.moe_grouped_gemm
        self.tp_group: dist.ProcessGroup | None = None
        """The expert-tensor-parallel group when the experts are split over TP (ETP = TP), else None."""
        self.gate_proj = nn.Parameter(torch.empty(e, h, f, device="meta", dtype=dtype))
        self.up_proj = nn.Parameter(torch.empty(e, h, f, device="meta", dtype=dtype))
        self.down_proj = nn.Parameter(torch.empty(e, f, h, device="meta", dtype=dtype))
        self.gate_bias: nn.Parameter | None = None
        self.up_bias: nn.Parameter | None = None
        self.down_bias: nn.Parameter | None = None
        if config.add_bias_linear:
            self.gate_bias = nn.Parameter(torch.empty(e, f, device="meta", dtype=dtype))
            self.up_bias = nn.Parameter(torch.empty(e, f, device="meta", dtype=dtype))
            self.down_bias = nn.Parameter(torch.empty(e, h, device="meta", dtype=dtype))
        self.act: Callable[[torch.Tensor], torch.Tensor] = quick_gelu if config.activation == "quick_geglu" else F.silu
        self.clamp = config.activation_func_clamp_value
        self.offset = config.glu_linear_offset

    def reset_parameters(self, std: float, out_std: float) -> None:
        """``normal(0, std)`` for gate/up, ``normal(0, out_std)`` for down (an output projection), drawn per
        expert in float32 in the order gate, up, down of expert 0, 1, ... (independent of expert parallelism)."""
        with torch.no_grad():
            for weight, sd in ((self.gate_proj, std), (self.up_proj, std), (self.down_proj, out_std)):
                fresh = torch.empty(weight.shape, dtype=torch.float32, device=weight.device).normal_(0.0, sd)
                weight.copy_(fresh)
            for bias in (self.gate_bias, self.up_bias, self.down_bias):
                if bias is not None:
                    bias.zero_()

    def forward(self, x: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """``x [N, hidden]``: tokens sorted by local expert, ``counts [E_local]`` tokens per local expert."""
        dtype = _compute_dtype(x)
        x = x.to(dtype)
        if self.tp_group is not None:
            x = SumGradOver.apply(x, self.tp_group)
        rows = None
        if self.gate_bias is not None:  # the local expert of every row
            rows = torch.repeat_interleave(torch.arange(counts.numel(), device=x.device), counts.to(x.device))
        gate = self._biased(grouped_mm(x, local_tensor(self.gate_proj).to(dtype), counts, self.grouped_gemm),
                            self.gate_bias, rows)
        up = self._biased(grouped_mm(x, local_tensor(self.up_proj).to(dtype), counts, self.grouped_gemm),
                          self.up_bias, rows)
        if self.clamp is not None:
            gate, up = gate.clamp(max=self.clamp), up.clamp(min=-self.clamp, max=self.clamp)
        if self.offset:
            up = up + self.offset
        y = grouped_mm(self.act(gate) * up, local_tensor(self.down_proj).to(dtype), counts, self.grouped_gemm)
        y = self._biased(y, self.down_bias, rows)
        return y if self.tp_group is None else SumOver.apply(y, self.tp_group)

    @staticmethod
    def _biased(y: torch.Tensor, bias: torch.Tensor | None, rows: torch.Tensor | None) -> torch.Tensor:
        """``y`` plus each row's expert bias (none without biases)."""
        if bias is None or rows is None:
            return y
        return y + local_tensor(bias).to(y.dtype)[rows]

    def extra_repr(self) -> str:
        """Expert counts and shapes, for ``print(model)``."""
        return (f"experts={self.num_local_experts}/{self.num_experts} (offset {self.expert_offset}), "
                f"hidden={self.gate_proj.shape[1]}, ffn={self.gate_proj.shape[2]} (local), "
                f"grouped_gemm={self.grouped_gemm}")


def quick_gelu(x: torch.Tensor) -> torch.Tensor:
    """Quick GELU ``x * sigmoid(1.702 x)`` (megatron-core's ``quick_gelu``, GPT-OSS's gate activation)."""
    return x * torch.sigmoid(1.702 * x)


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    if torch.is_autocast_enabled(x.device.type):
        return torch.get_autocast_dtype(x.device.type)
    return x.dtype


def grouped_mm_supported(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether ``torch._grouped_mm`` computes ``x @ weight[g]`` per group here: rows of 16-byte aligned width (the
    kernel's stride rule, on CPU too), at least one token (its backward needs one), and a device that has the kernel:
    CPU (torch >= 2.9) or CUDA with compute capability >= 9.0 in bfloat16."""
    if not hasattr(torch, "_grouped_mm") or x.shape[0] == 0:
        return False
    if (x.shape[1] * x.element_size()) % 16 or (weight.shape[2] * weight.element_size()) % 16:
        return False
    if x.device.type == "cpu":
        return True
    if x.device.type != "cuda" or x.dtype != torch.bfloat16 or weight.dtype != torch.bfloat16:
        return False
    return torch.cuda.get_device_capability(x.device) >= (9, 0)


def grouped_mm(x: torch.Tensor, weight: torch.Tensor, counts: torch.Tensor, grouped: bool) -> torch.Tensor:
    """``[N, a] x [G, a, b] -> [N, b]``: rows ``counts[0]`` first go through ``weight[0]``, the next ``counts[1]``
    through ``weight[1]``, ...; ``torch._grouped_mm`` when ``grouped`` and supported, else one matmul per group."""
    if grouped and grouped_mm_supported(x, weight):
        offsets = torch.cumsum(counts, dim=0).to(torch.int32)
        return torch._grouped_mm(x, weight, offs=offsets)
    parts = torch.split(x, counts.tolist())
    return torch.cat([part @ weight[g] for g, part in enumerate(parts)])


def local_dispatch(experts: GroupedExperts, x_sorted: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """No expert parallelism: every expert is local."""
    return experts(x_sorted, counts)


__all__ = ["GroupedExperts", "SumGradOver", "SumOver", "grouped_mm", "grouped_mm_supported", "local_dispatch",
           "local_tensor", "num_experts_of", "quick_gelu"]
