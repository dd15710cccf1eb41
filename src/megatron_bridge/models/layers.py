"""Building blocks of the local decoder: RMSNorm, LayerNorm and rotary position embeddings (RoPE).

Norms compute in float32 and cast back to the input dtype, so a model cast to bf16/fp16 stays numerically stable.
RoPE keeps its ``inv_freq`` buffer in float32 and builds cos/sin in float32.
"""

import math

import torch
from torch import nn
from torch.nn import functional as F

from megatron_bridge.config.model import ModelConfig


class RMSNorm(nn.Module):
    """Root-mean-square norm (Llama): ``x / sqrt(mean(x**2) + eps) * weight``, computed in float32; with
    ``zero_centered`` (Gemma) the scale is ``1 + weight`` and ``weight`` starts at zero."""

    def __init__(
        self,
        dim: int,
        eps: float = 1e-5,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        zero_centered: bool = False,
    ) -> None:
        super().__init__()
        self.eps = eps
        self.zero_centered = zero_centered
        self.weight = nn.Parameter(torch.full((dim,), 0.0 if zero_centered else 1.0, device=device, dtype=dtype))

    def reset_parameters(self) -> None:
        """Set the scale to ones (the weight to zeros when zero-centred)."""
        with torch.no_grad():
            self.weight.fill_(0.0 if self.zero_centered else 1.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Normalize over the last dimension; the result has the dtype of ``x``."""
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(dim=-1, keepdim=True) + self.eps)
        scale = 1.0 + self.weight.float() if self.zero_centered else self.weight.float()
        return (x32 * scale).to(x.dtype)

    def extra_repr(self) -> str:
        """Shape and epsilon, for ``print(model)``."""
        return f"{self.weight.shape[0]}, eps={self.eps}"


class LayerNorm(nn.Module):
    """LayerNorm with weight and bias (GPT-2 style), computed in float32."""

    def __init__(
        self,
        dim: int,
        eps: float = 1e-5,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        zero_centered: bool = False,
    ) -> None:
        super().__init__()
        self.eps = eps
        self.zero_centered = zero_centered
        self.weight = nn.Parameter(torch.full((dim,), 0.0 if zero_centered else 1.0, device=device, dtype=dtype))
        self.bias = nn.Parameter(torch.zeros(dim, device=device, dtype=dtype))

    def reset_parameters(self) -> None:
        """Set the scale to ones (the weight to zeros when zero-centred) and the shift to zeros."""
        with torch.no_grad():
            self.weight.fill_(0.0 if self.zero_centered else 1.0)
            self.bias.zero_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Normalize over the last dimension; the result has the dtype of ``x``."""
        weight = 1.0 + self.weight.float() if self.zero_centered else self.weight.float()
        out = F.layer_norm(x.float(), (x.shape[-1],), weight, self.bias.float(), self.eps)
        return out.to(x.dtype)

    def extra_repr(self) -> str:
        """Shape and epsilon, for ``print(model)``."""
        return f"{self.weight.shape[0]}, eps={self.eps}"


def build_norm(config: ModelConfig, dim: int, *, device: torch.device | str | None, dtype: torch.dtype) -> nn.Module:
    """The normalization layer named by ``config.normalization`` over ``dim`` features."""
    cls = RMSNorm if config.normalization == "RMSNorm" else LayerNorm
    return cls(dim, config.layernorm_epsilon, device=device, dtype=dtype,
               zero_centered=config.layernorm_zero_centered_gamma)


def rope_inv_freq(config: ModelConfig, device: torch.device | str | None = None, *,
                  local: bool = False) -> torch.Tensor:
    """RoPE inverse frequencies ``base ** (-2i / d)`` (float32, shape ``[d // 2]``), ``d = config.rope_head_dim``.

    ``local``: those of the window layers, plain RoPE of base ``config.rotary_base_local`` (Gemma 3's local RoPE).
    ``config.seq_len_interpolation_factor`` divides the (global) frequencies (linear scaling, Hugging Face's
    ``rope_type: linear``).

    With ``config.rope_scaling`` the Llama 3.1 rule is applied: with ``L = rope_original_max_position_embeddings``,
    frequencies whose wavelength ``2*pi/f`` is shorter than ``L / high_freq_factor`` are kept, those longer than
    ``L / low_freq_factor`` are divided by ``rope_scaling_factor``, and the ones in between are interpolated with
    ``smooth = (L / wavelength - low_freq_factor) / (high_freq_factor - low_freq_factor)``:
    ``f' = (1 - smooth) * f / factor + smooth * f``. Values are computed in float64 and rounded once to float32.
    """
    dim = config.rope_head_dim
    exponents = torch.arange(0, dim, 2, dtype=torch.float64, device=device) / dim
    if local:
        return (1.0 / (config.rotary_base_local**exponents)).to(torch.float32)
    inv_freq = 1.0 / (config.rotary_base**exponents)
    if config.seq_len_interpolation_factor is not None:
        inv_freq = inv_freq / config.seq_len_interpolation_factor
    if config.position_embedding_type == "yarn":
        return _yarn_inv_freq(config, inv_freq).to(torch.float32)
    if config.rope_scaling:
        factor = config.rope_scaling_factor
        low, high = config.rope_low_freq_factor, config.rope_high_freq_factor
        old_len = config.rope_original_max_position_embeddings
        low_freq_wavelen = old_len / low
        high_freq_wavelen = old_len / high
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
        smooth = (old_len / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        is_medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
        inv_freq = torch.where(is_medium, smoothed, scaled)
    return inv_freq.to(torch.float32)


def yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    """YaRN's attention-scale term ``0.1 * mscale * ln(scale) + 1`` (1 for ``scale <= 1``)."""
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def rope_attention_factor(config: ModelConfig) -> float:
    """The factor YaRN multiplies the cos/sin tables by (1 for plain RoPE): ``yarn_mscale(factor, yarn_mscale) /
    yarn_mscale(factor, yarn_mscale_all_dim)`` when yarn_mscale_all_dim is set, else ``yarn_mscale(factor)``."""
    if config.position_embedding_type != "yarn":
        return 1.0
    factor = config.yarn_rotary_scaling_factor
    if config.yarn_mscale and config.yarn_mscale_all_dim:
        return yarn_mscale(factor, config.yarn_mscale) / yarn_mscale(factor, config.yarn_mscale_all_dim)
    return yarn_mscale(factor)


def _yarn_inv_freq(config: ModelConfig, inv_freq: torch.Tensor) -> torch.Tensor:
    """YaRN (arXiv 2309.00071): dimensions that rotate fewer than ``yarn_beta_slow`` times over the original context
    are interpolated (divided by the factor), those rotating more than ``yarn_beta_fast`` times keep their frequency,
    with a linear ramp between (bounds rounded outward with yarn_correction_range_round_to_int), as transformers'
    ``_compute_yarn_parameters``; the ramp is computed in float32 like it."""
    dim, base = config.rope_head_dim, config.rotary_base
    original = config.yarn_original_max_position_embeddings

    def correction_dim(rotations: float) -> float:
        return (dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(config.yarn_beta_fast), correction_dim(config.yarn_beta_slow)
    if config.yarn_correction_range_round_to_int:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # no zero-width ramp
    ramp = ((torch.arange(dim // 2, dtype=torch.float32, device=inv_freq.device) - low) / (high - low)).clamp(0, 1)
    extrapolation = (1 - ramp).to(inv_freq.dtype)
    interpolated = inv_freq / config.yarn_rotary_scaling_factor
    return interpolated * (1 - extrapolation) + inv_freq * extrapolation


class RotaryEmbedding(nn.Module):
    """Produces the RoPE cos/sin tables for given positions from a non-persistent float32 ``inv_freq`` buffer.

    With ``config.rotary_base_local`` a second buffer, ``inv_freq_local``, holds the window layers' frequencies
    (:meth:`forward` with ``local=True``).
    The buffers are not saved in checkpoints and are recomputed by :meth:`reset_parameters` (e.g. after
    ``to_empty``). If the module was cast to a low-precision dtype (``model.to(torch.bfloat16)`` casts buffers
    too), the frequencies are recomputed in float32 on the fly so positions stay exact.
    """

    def __init__(self, config: ModelConfig, *, device: torch.device | str | None = None) -> None:
        super().__init__()
        self.config = config
        self.register_buffer("inv_freq", rope_inv_freq(config, device=device), persistent=False)
        self.has_local = config.rotary_base_local is not None
        """Whether the window layers have their own RoPE (``inv_freq_local``)."""
        if self.has_local:
            self.register_buffer("inv_freq_local", rope_inv_freq(config, device=device, local=True), persistent=False)

    def reset_parameters(self) -> None:
        """Recompute the frequency buffers in place on their current device."""
        with torch.no_grad():
            for name in ("inv_freq", "inv_freq_local") if self.has_local else ("inv_freq",):
                buffer = getattr(self, name)
                fresh = rope_inv_freq(self.config, device=buffer.device, local=name == "inv_freq_local")
                if buffer.dtype == torch.float32:
                    buffer.copy_(fresh)
                else:
                    setattr(self, name, fresh)

    def forward(self, position_ids: torch.Tensor, local: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin of shape ``[b, 1, s, head_dim]`` in float32 for ``position_ids`` of shape ``[b, s]``; those of
        the window layers' RoPE with ``local`` (only when ``config.rotary_base_local`` is set)."""
        inv_freq = self.inv_freq_local if local else self.inv_freq
        if inv_freq.dtype != torch.float32:
            inv_freq = rope_inv_freq(self.config, device=inv_freq.device, local=local)
        freqs = position_ids.to(torch.float32)[..., None] * inv_freq.to(position_ids.device)
        emb = torch.cat((freqs, freqs), dim=-1)[:, None, :, :]
        factor = 1.0 if local else rope_attention_factor(self.config)
        if factor == 1.0:
            return emb.cos(), emb.sin()
        return emb.cos() * factor, emb.sin() * factor


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rotary_pos_emb(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` (``[b, heads, s, head_dim]``) by the RoPE angles (non-interleaved halves, as Llama/Megatron).

    Computed in float32; the result has the dtype of ``x``.
    """
    x32 = x.float()
    return (x32 * cos + _rotate_half(x32) * sin).to(x.dtype)
