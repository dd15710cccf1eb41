"""Llama 3 / 3.1 / 3.2 (``LlamaForCausalLM``): RMSNorm, SwiGLU, grouped-query attention, RoPE with optional llama3
scaling."""

from megatron_bridge.config.families import FamilySpec


SPEC = FamilySpec(
    name="llama",
    hf_architectures=("LlamaForCausalLM",),
    hf_model_type="llama",
    perf_family="llama",
    bridge="megatron_bridge.families.llama.bridge:LlamaFamily",
    summary="RMSNorm, SwiGLU, GQA, RoPE (llama3 scaling), optional q/k/v/o and MLP biases",
)
