"""The model families the Bridge converts, one mapping module each. Importing this package registers them.

| family | HF architecture | module |
|---|---|---|
| Llama 3 / 3.1 / 3.2 | ``LlamaForCausalLM`` | ``llama.py`` |
| Qwen3 dense | ``Qwen3ForCausalLM`` | ``qwen3.py`` |

Adding a family (e.g. Qwen3-MoE, ``Qwen3MoeForCausalLM``, once the model supports experts): write
``qwen3_moe.py`` with a :class:`~megatron_bridge.bridge.families.base.ModelFamily` subclass decorated with
:func:`~megatron_bridge.bridge.families.base.register_family` — its ``config_from_hf``/``config_to_hf`` map the MoE
keys (``num_experts``, ``num_experts_per_tok``, ``moe_intermediate_size``, ``norm_topk_prob``, ...), its
``matches`` recognizes an MoE :class:`ModelConfig`, and its ``weight_names`` lists the router and per-expert
tensors — then import it below. Register it *before* a dense family whose ``matches`` would also accept it.
"""

from megatron_bridge.bridge.families import llama, qwen3  # noqa: F401  (registration)
from megatron_bridge.bridge.families.base import (
    ModelFamily,
    family_by_name,
    family_for_hf_config,
    family_for_model_config,
    family_names,
    register_family,
    supported_architectures,
)


__all__ = [
    "ModelFamily",
    "family_by_name",
    "family_for_hf_config",
    "family_for_model_config",
    "family_names",
    "register_family",
    "supported_architectures",
]
