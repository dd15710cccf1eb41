"""Gemma 2 (``Gemma2ForCausalLM``, ``model_type: gemma2``): Gemma 3's layer without the q/k norm, with attention
and final logit soft-capping (``model.attn_logit_softcapping``, ``model.final_logit_softcapping``), a sliding window
on every other layer (the first one windowed) and one RoPE base; zero-centred RMSNorm, four norms per layer, GeGLU
with the tanh GELU, the softmax scale from ``query_pre_attn_scalar``, the embedding scaled by √hidden and tied."""

from megatron_bridge.config.families import FamilySpec


SPEC = FamilySpec(
    name="gemma2",
    hf_architectures=("Gemma2ForCausalLM",),
    hf_model_type="gemma2",
    perf_family="gemma",
    bridge="megatron_bridge.families.gemma2.bridge:Gemma2Family",
    recipes="megatron_bridge.families.gemma2.recipes",
    summary="attention and final logit soft-capping, window / full layers alternating, zero-centred RMSNorm, four "
            "norms per layer, GeGLU, scaled embedding",
)
