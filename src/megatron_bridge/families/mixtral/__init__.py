"""Mixtral (``MixtralForCausalLM``): Mistral's attention with a sparse mixture of experts in every layer (8 SwiGLU
experts, softmax top-2 routing renormalized over the two, no shared expert)."""

from megatron_bridge.config.families import FamilySpec


SPEC = FamilySpec(
    name="mixtral",
    hf_architectures=("MixtralForCausalLM",),
    hf_model_type="mixtral",
    perf_family="mixtral",
    bridge="megatron_bridge.families.mixtral.bridge:MixtralFamily",
    recipes="megatron_bridge.families.mixtral.recipes",
    summary="Mistral attention (optional sliding window), softmax top-2 of 8 experts in every layer, no shared expert",
)
