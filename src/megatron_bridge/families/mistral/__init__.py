"""Mistral (``MistralForCausalLM``): the Llama layout with sliding-window attention in every layer (Mistral 7B v0.1:
4096 tokens) and an explicit head width."""

from megatron_bridge.config.families import FamilySpec


SPEC = FamilySpec(
    name="mistral",
    hf_architectures=("MistralForCausalLM",),
    hf_model_type="mistral",
    perf_family="mistral",
    bridge="megatron_bridge.families.mistral.bridge:MistralFamily",
    recipes="megatron_bridge.families.mistral.recipes",
    summary="Llama layout with sliding-window attention (sliding_window = W tokens: window_size = (W - 1, 0))",
)
