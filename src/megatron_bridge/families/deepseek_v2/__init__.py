"""DeepSeek-V2 (``DeepseekV2ForCausalLM``; DeepSeek-V2-Lite): DeepSeek-V3's multi-latent attention with interleaved
RoPE pairs (YaRN), dense first layers and shared experts, but softmax routing over every expert (greedy or
group-limited greedy top-k, a group scored by its best expert) without an expert bias, the k probabilities scaled by
``routed_scaling_factor`` and normalized only with ``norm_topk_prob``. The blocks are the DeepSeek-V3 family's."""

from megatron_bridge.config.families import FamilySpec


SPEC = FamilySpec(
    name="deepseek_v2",
    hf_architectures=("DeepseekV2ForCausalLM",),
    hf_model_type="deepseek_v2",
    perf_family="deepseek",
    bridge="megatron_bridge.families.deepseek_v2.bridge:DeepseekV2Family",
    recipes="megatron_bridge.families.deepseek_v2.recipes",
    summary="DeepSeek-V3's multi-latent attention, dense first layers and shared experts with softmax greedy or "
            "group-limited routing, no expert bias",
)
