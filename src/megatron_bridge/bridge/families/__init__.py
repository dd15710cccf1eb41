"""The model families the Bridge converts, one mapping module each. Importing this package registers them.

| family | HF architecture | module |
|---|---|---|
| Llama 3 / 3.1 / 3.2 | ``LlamaForCausalLM`` | ``llama.py`` |
| Qwen3 dense | ``Qwen3ForCausalLM`` | ``qwen3.py`` |
| Qwen3-MoE | ``Qwen3MoeForCausalLM`` | ``qwen3_moe.py`` |

Adding a family: write a module with a :class:`~megatron_bridge.bridge.families.base.ModelFamily` subclass decorated
with :func:`~megatron_bridge.bridge.families.base.register_family` — its ``config_from_hf``/``config_to_hf`` map the
config keys, its ``matches`` recognizes the :class:`ModelConfig` it covers (``moe`` tells dense and MoE families
apart), its ``weight_names`` lists the 1:1 tensor names and ``stacked_weights`` the tensors that are stacks of
several HF tensors (MoE experts) — then import it below.
"""

from megatron_bridge.bridge.families import llama, qwen3, qwen3_moe  # noqa: F401  (registration)
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
