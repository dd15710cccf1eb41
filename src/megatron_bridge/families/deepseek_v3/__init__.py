"""DeepSeek-V3 (``DeepseekV3ForCausalLM``; Moonlight-16B-A3B has the same architecture): multi-latent attention
(``model.multi_latent_attention``, ``models/mla.py``) with YaRN RoPE, dense first layers, then mixtures of experts with
shared experts and sigmoid routing with an expert bias, limited to groups of experts."""

from megatron_bridge.config.families import FamilySpec


SPEC = FamilySpec(
    name="deepseek_v3",
    hf_architectures=("DeepseekV3ForCausalLM",),
    hf_model_type="deepseek_v3",
    perf_family="deepseek",
    bridge="megatron_bridge.families.deepseek_v3.bridge:DeepseekV3Family",
    recipes="megatron_bridge.families.deepseek_v3.recipes",
    summary="multi-latent attention with YaRN, dense first layers, shared experts, group-limited sigmoid routing "
            "with an expert bias",
)
