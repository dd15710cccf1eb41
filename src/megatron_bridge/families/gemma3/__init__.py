"""Gemma 3, text (``Gemma3ForCausalLM``, ``model_type: gemma3_text``): zero-centred RMSNorm (``x · (1 + w)``), four
norms per layer, q/k norm, GeGLU with the tanh GELU, the embedding scaled by √hidden, five window layers to one
full layer with their own RoPE base (``model.rotary_base_local``), the softmax scale from ``query_pre_attn_scalar``,
tied embeddings."""

from megatron_bridge.config.families import FamilySpec


SPEC = FamilySpec(
    name="gemma3",
    hf_architectures=("Gemma3ForCausalLM",),
    hf_model_type="gemma3_text",
    perf_family="gemma",
    bridge="megatron_bridge.families.gemma3.bridge:Gemma3Family",
    recipes="megatron_bridge.families.gemma3.recipes",
    summary="zero-centred RMSNorm, four norms per layer, GeGLU, scaled embedding, 5 window : 1 full layers with a "
            "local RoPE base",
)
