"""Qwen3-MoE (``Qwen3MoeForCausalLM``): Qwen3 attention with softmax-routed experts and no shared expert."""

from megatron_bridge.config.families import FamilySpec


SPEC = FamilySpec(
    name="qwen3_moe",
    hf_architectures=("Qwen3MoeForCausalLM",),
    hf_model_type="qwen3_moe",
    perf_family="qwen",
    bridge="megatron_bridge.families.qwen3_moe.bridge:Qwen3MoeFamily",
    summary="Qwen3 attention, softmax top-k routed experts, no shared expert",
)
