"""GPT-OSS (``GptOssForCausalLM``): attention with learnable sinks and biases, alternating sliding-window (128) and
full layers, YaRN RoPE, a mixture of experts in every layer (router with a bias, top-k of the logits then softmax over
the k, no shared expert) whose experts are the clamped quick-GeGLU with biases, gate and up interleaved in the
checkpoint."""

from megatron_bridge.config.families import FamilySpec


SPEC = FamilySpec(
    name="gpt_oss",
    hf_architectures=("GptOssForCausalLM",),
    hf_model_type="gpt_oss",
    perf_family="gpt_oss",
    bridge="megatron_bridge.families.gpt_oss.bridge:GptOssFamily",
    recipes="megatron_bridge.families.gpt_oss.recipes",
    summary="attention sinks and biases, alternating window (128) / full layers, YaRN, biased top-k router, clamped "
            "quick-GeGLU experts with biases in every layer",
)
