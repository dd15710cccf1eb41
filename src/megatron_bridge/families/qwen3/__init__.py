"""Qwen3 dense (``Qwen3ForCausalLM``): the Llama layout with per-head q/k RMSNorm and an explicit head width."""

from megatron_bridge.config.families import FamilySpec


SPEC = FamilySpec(
    name="qwen3",
    hf_architectures=("Qwen3ForCausalLM",),
    hf_model_type="qwen3",
    perf_family="qwen",
    bridge="megatron_bridge.families.qwen3.bridge:Qwen3Family",
    summary="Llama layout with q/k RMSNorm per head, head_dim independent of the width",
)
