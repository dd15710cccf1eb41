"""What a model family's Hugging Face mapping states, the shared Llama-style mapping, and the lookup of families.

A family's mapping (``bridge.py`` in its folder under ``src/megatron_bridge/families/``, named by its spec's
``bridge``) is a :class:`ModelFamily` subclass. Its spec (config/families.py) gives its name and HF
``architectures`` and ``model_type``; the class states which :class:`ModelConfig` it can express
(:meth:`ModelFamily.matches`), the config mapping both ways and the weight-name mapping. Everything the
HF config says is either mapped, checked against the one value we support (:attr:`ModelFamily.fixed_hf_values`)
or listed as harmless (:attr:`ModelFamily.ignored_hf_keys`); anything else is a :class:`BridgeError`.
"""

from dataclasses import dataclass
from functools import partial
from typing import Any, ClassVar

from megatron_bridge.bridge.rope import RopeFormat, rope_fields_from_hf, rope_to_hf
from megatron_bridge.config import decoder_names as n
from megatron_bridge.config import families as registry
from megatron_bridge.config.families import FamilySpec
from megatron_bridge.config.model import ModelConfig
from megatron_bridge.errors import BridgeError, ConfigValidationError


_REQUIRED = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "vocab_size")
COMMON_IGNORED_KEYS = frozenset({
    "architectures", "model_type", "transformers_version", "torch_dtype", "dtype", "use_cache", "_name_or_path",
    "bos_token_id", "eos_token_id", "pad_token_id", "initializer_range", "output_attentions", "output_hidden_states",
    "return_dict", "tie_word_embeddings", "rope_theta", "rope_scaling", "rope_parameters", "partial_rotary_factor",
    # generic PretrainedConfig keys (a transformers config object's to_dict()) that a causal LM's weights ignore
    "id2label", "label2id", "problem_type", "chunk_size_feed_forward", "torchscript", "tokenizer_class", "prefix",
    "sep_token_id", "decoder_start_token_id", "task_specific_params", "finetuning_task", "use_bfloat16",
    "tf_legacy_loss", "is_decoder", "cross_attention_hidden_size",
})
"""Keys every family reads elsewhere (RoPE, token ids) or that do not change the weights' meaning."""
GENERIC_FIXED_VALUES: dict[str, tuple[Any, ...]] = {
    "is_encoder_decoder": (False, None), "add_cross_attention": (False, None), "tie_encoder_decoder": (False, None),
    "pruned_heads": ({}, None),
}
"""Generic PretrainedConfig keys a decoder-only model must leave at their defaults."""
HF_DECODER = "model"
"""The HF module holding the decoder: our names (the shared decoder's, HF Llama's) sit under it, the output layer
beside it."""


@dataclass(frozen=True)
class StackedWeight:
    """One of our tensors that is several HF tensors: ours ``[n, ...]`` is ``stack(hf[0], ..., hf[n-1])``, each
    transposed (its last two dimensions) when ``transpose`` (MoE experts: HF stores one ``[out, in]`` matrix per
    expert, we store ``[E, in, out]``)."""

    hf_names: tuple[str, ...]
    transpose: bool = False


@dataclass(frozen=True)
class InterleavedWeight:
    """One of our tensors that is an interleaved part of one HF tensor: ours is ``hf[..., index::parts]`` (the last
    dimension; GPT-OSS's ``gate_up_proj``: the gate the even columns, the up half the odd ones). Export interleaves
    the ``parts`` tensors back into the one HF tensor."""

    hf_name: str
    index: int
    parts: int = 2


class ModelFamily:
    """Base class of a family mapping (see the module docstring); subclasses set the class attributes. Built once
    per family from its :class:`~megatron_bridge.config.families.FamilySpec`, which gives its name and HF names."""

    def __init__(self, spec: FamilySpec) -> None:
        self.spec = spec

    @property
    def name(self) -> str:
        """The family's name (``model.family``), e.g. "llama"."""
        return self.spec.name

    @property
    def architectures(self) -> tuple[str, ...]:
        """HF ``architectures`` entries this family reads; the first one is written on export."""
        return self.spec.hf_architectures

    @property
    def model_type(self) -> str:
        """HF ``model_type`` written on export."""
        return self.spec.hf_model_type

    qk_layernorm: ClassVar[bool] = False
    """Whether the family has per-head q/k RMSNorm (Qwen3)."""
    moe: ClassVar[bool] = False
    """Whether the family's models are mixtures of experts (a dense family never matches an MoE config)."""
    mla: ClassVar[bool] = False
    """Whether the family's attention is multi-latent attention (``model.multi_latent_attention``)."""
    soft_capping: ClassVar[bool] = False
    """Whether the family's HF config has logit soft-capping (Gemma 2); without it a model with
    ``model.attn_logit_softcapping`` or ``model.final_logit_softcapping`` set is not exported."""
    hf_defaults: ClassVar[dict[str, Any]] = {}
    """transformers' class defaults for keys a config.json may omit (max_position_embeddings, rms_norm_eps, ...)."""
    fixed_hf_values: ClassVar[dict[str, tuple[Any, ...]]] = {
        "hidden_act": ("silu",), "attention_dropout": (0, 0.0, None), "pretraining_tp": (1, None),
        **GENERIC_FIXED_VALUES,
    }
    """HF keys whose only supported values are listed (absent keys are fine)."""
    ignored_hf_keys: ClassVar[frozenset[str]] = frozenset()
    """Family keys that do not change the weights' meaning."""
    mapped_hf_keys: ClassVar[frozenset[str]] = frozenset({
        *_REQUIRED, "num_key_value_heads", "head_dim", "max_position_embeddings", "rms_norm_eps", "attention_bias",
        "mlp_bias",
    })

    # --------------------------------------------------------------------------------------------- config in
    def config_from_hf(self, hf: dict[str, Any]) -> ModelConfig:
        """The :class:`ModelConfig` of a HF config dict; BridgeError for unknown or unsupported settings."""
        self.check_hf_config(hf)
        get = partial(self.hf_value, hf)
        try:
            heads = int(hf["num_attention_heads"])
            hidden = int(hf["hidden_size"])
            max_pos = int(get("max_position_embeddings"))
            fields: dict[str, Any] = {
                "family": self.name,
                "num_layers": int(hf["num_hidden_layers"]),
                "hidden_size": hidden,
                "ffn_hidden_size": int(hf["intermediate_size"]),
                "num_attention_heads": heads,
                "num_query_groups": int(get("num_key_value_heads") or heads),
                "kv_channels": int(get("head_dim") or hidden // heads),
                "vocab_size": int(hf["vocab_size"]),
                "seq_length": max_pos,
                "max_position_embeddings": max_pos,
                "layernorm_epsilon": float(get("rms_norm_eps")),
                "normalization": "RMSNorm",
                "activation": "swiglu",
                "qk_layernorm": self.qk_layernorm,
                "add_qkv_bias": bool(get("attention_bias")),
                "attention_output_bias": bool(get("attention_bias")),
                "add_bias_linear": bool(get("mlp_bias")),
                "share_embeddings_and_output_weights": bool(get("tie_word_embeddings")),
                "init_method_std": float(hf.get("initializer_range") or 0.02),
                **rope_fields_from_hf(hf),
            }
        except (KeyError, TypeError, ValueError) as exc:
            raise BridgeError(f"{self.name} config.json lacks or has a bad field: {type(exc).__name__}: {exc}") from exc
        return ModelConfig(**fields)

    def check_hf_config(self, hf: dict[str, Any]) -> None:
        """BridgeError naming the first key that is missing, unknown, or set to a value we cannot convert."""
        missing = [k for k in _REQUIRED if hf.get(k) is None]
        if missing:
            raise BridgeError(f"{self.name} config.json lacks required key(s) {missing}")
        for key, allowed in self.fixed_hf_values.items():
            if key in hf and hf[key] not in allowed:
                raise BridgeError(f"config.json {key}={hf[key]!r} is not supported for {self.name}; supported: "
                                  f"{[v for v in allowed if v is not None]}")
        known = COMMON_IGNORED_KEYS | self.mapped_hf_keys | self.ignored_hf_keys | set(self.fixed_hf_values)
        unknown = sorted(k for k in hf if k not in known and not k.startswith("_"))
        if unknown:
            raise BridgeError(f"config.json has key(s) the {self.name} mapping does not know: {unknown}; they may "
                              "change the model, so the conversion stops (extend the family mapping to support them)")

    def hf_value(self, hf: dict[str, Any], key: str) -> Any:
        """``hf[key]``, or transformers' default (:attr:`hf_defaults`) when the key is absent or null."""
        return hf.get(key) if hf.get(key) is not None else self.hf_defaults.get(key)

    # -------------------------------------------------------------------------------------------- config out
    def matches(self, config: ModelConfig) -> bool:
        """Whether this family can express ``config`` (used to pick the family of one of our checkpoints)."""
        return (config.normalization == "RMSNorm" and config.activation == "swiglu"
                and config.qk_layernorm == self.qk_layernorm and config.is_moe == self.moe
                and config.multi_latent_attention == self.mla)

    def config_to_hf(self, config: ModelConfig, *, rope_format: RopeFormat = "rope_parameters",
                     dtype: str = "float32") -> dict[str, Any]:
        """config.json for ``config`` (token ids are added by the caller); BridgeError when not expressible."""
        if not self.matches(config):
            raise BridgeError(f"the model (normalization={config.normalization!r}, activation={config.activation!r}, "
                              f"qk_layernorm={config.qk_layernorm}) is not a {self.name} model")
        caps = (config.attn_logit_softcapping, config.final_logit_softcapping)
        if not self.soft_capping and caps != (None, None):
            raise BridgeError(f"{self.name} export: Hugging Face's {self.architectures[0]} has no logit soft-capping, "
                              f"but the model has model.attn_logit_softcapping={caps[0]} and "
                              f"model.final_logit_softcapping={caps[1]}; set them to None or use a family that has "
                              "them (gemma2)")
        if config.add_qkv_bias != config.has_attention_output_bias:
            raise BridgeError(
                f"{self.name} export: HF attention_bias sets the query/key/value and output projections' biases "
                f"together, but the model has add_qkv_bias={config.add_qkv_bias} and an output projection bias="
                f"{config.has_attention_output_bias}")
        max_pos = config.max_position_embeddings or config.seq_length
        return {
            "architectures": [self.architectures[0]],
            "model_type": self.model_type,
            "hidden_size": config.hidden_size,
            "intermediate_size": config.ffn_hidden_size,
            "num_hidden_layers": config.num_layers,
            "num_attention_heads": config.num_attention_heads,
            "num_key_value_heads": config.num_kv_heads,
            "head_dim": config.head_dim,
            "vocab_size": config.vocab_size,
            "max_position_embeddings": max_pos,
            "rms_norm_eps": config.layernorm_epsilon,
            "hidden_act": "silu",
            "attention_bias": config.add_qkv_bias,
            "attention_dropout": 0.0,
            "tie_word_embeddings": config.share_embeddings_and_output_weights,
            "initializer_range": config.init_method_std,
            "use_cache": True,
            "dtype": dtype,
            **rope_to_hf(config, rope_format),
            **self.extra_hf_config(config),
        }

    def extra_hf_config(self, config: ModelConfig) -> dict[str, Any]:
        """Family-specific config.json keys (subclasses)."""
        return {}

    # --------------------------------------------------------------------------------------------- weights
    def weight_names(self, config: ModelConfig) -> dict[str, str]:
        """Our parameter name → HF name, for every parameter the model built from ``config`` has: the shared
        decoder's names (:mod:`megatron_bridge.config.decoder_names`) under HF's ``model.``, but the output layer."""
        names = {name: f"{HF_DECODER}.{name}" for name in (f"{n.EMBEDDING}.weight", f"{n.FINAL_NORM}.weight")}
        if not config.share_embeddings_and_output_weights:
            names[f"{n.OUTPUT}.weight"] = f"{n.OUTPUT}.weight"
        for i in range(config.num_layers):
            names.update({f"{n.layer(i)}.{ours}": f"{HF_DECODER}.{n.layer(i)}.{ours}"
                          for ours in self.layer_weight_names(config)})
        return names

    def stacked_weights(self, config: ModelConfig) -> dict[str, StackedWeight]:
        """Our parameters that are stacks of several HF tensors (MoE families); the rest is ``weight_names``."""
        return {}

    def interleaved_weights(self, config: ModelConfig) -> dict[str, InterleavedWeight]:
        """Our parameters that are interleaved parts of one HF tensor (GPT-OSS's experts); none by default."""
        return {}

    def copied_weights(self, config: ModelConfig) -> dict[str, str]:
        """HF tensors that repeat one of our parameters (HF name → our name), as DeepSeek-V3's MTP layers repeat
        the embedding and the output layer: on import not read (compared with the mapped tensor when present; a
        differing copy is warned about), on export written again. None by default."""
        return {}

    def config_for_folder(self, config: ModelConfig, hf: dict[str, Any], tensor_names: list[str]) -> None:
        """Set on ``config`` what a HF folder's tensors say beyond its config.json (DeepSeek-V3: whether the MTP
        layers are stored); nothing by default."""

    def layer_weight_names(self, config: ModelConfig) -> list[str]:
        """Names inside one decoder layer (identical on both sides for the Llama-style families)."""
        return n.dense_layer_parameters(config)

    def read_hf_tensor(self, reader: Any, name: str) -> Any:
        """HF tensor ``name`` as the model takes it, from ``reader`` (a ``bridge.hf_reader.HFWeightsReader``): the
        stored tensor; a family with stored encodings (DeepSeek-V3's fp8 blocks) decodes them here."""
        return reader.get(name)

    def read_hf_shapes(self, reader: Any) -> dict[str, tuple[int, ...]]:
        """Name → shape of every HF tensor as :meth:`read_hf_tensor` gives it: the stored ones; a family whose
        encoding stores one tensor as several (GPT-OSS's MXFP4 ``*_blocks`` and ``*_scales``) names the decoded one."""
        return reader.shapes()

    def ignorable_hf_weight(self, name: str, config: ModelConfig) -> bool:
        """HF tensors that are dropped on import: RoPE ``inv_freq`` buffers of old checkpoints, and a stray output
        layer weight stored next to tied embeddings (transformers ignores it as well)."""
        if name.endswith(f"{n.ROTARY}.inv_freq"):
            return True
        return name == f"{n.OUTPUT}.weight" and config.share_embeddings_and_output_weights


# ------------------------------------------------------------------------------------------------- registry
_FAMILIES: dict[str, ModelFamily] = {}


def family_names() -> list[str]:
    """Names of the registered families (config/families.py)."""
    return registry.family_names()


def supported_architectures() -> list[str]:
    """Every HF architecture a registered family reads."""
    return sorted(arch for spec in registry.all_families() for arch in spec.hf_architectures)


def family_by_name(name: str) -> ModelFamily:
    """The Hugging Face mapping of the family registered as ``name`` (built once, from its spec's ``bridge``)."""
    if name not in _FAMILIES:
        try:
            spec = registry.get_family(name)
        except ConfigValidationError as exc:
            raise BridgeError(f"model family {name!r} is unknown; known: {family_names()}") from exc
        cls = registry.load_family_object(spec, spec.bridge)
        if not (isinstance(cls, type) and issubclass(cls, ModelFamily)):
            raise TypeError(f"{spec.bridge} (the {name} family's bridge) is not a ModelFamily subclass")
        _FAMILIES[name] = cls(spec)
    return _FAMILIES[name]


def family_for_hf_config(hf: dict[str, Any]) -> ModelFamily:
    """The family of a HF config dict, from its ``architectures`` (else its ``model_type``)."""
    archs = hf.get("architectures") or []
    for arch in archs if isinstance(archs, list) else []:
        spec = registry.family_for_architecture(arch) if isinstance(arch, str) else None
        if spec is not None:
            return family_by_name(spec.name)
    spec = None if archs else registry.family_for_model_type(hf.get("model_type"))
    if spec is not None:
        return family_by_name(spec.name)
    raise BridgeError(f"architecture {archs or hf.get('model_type')!r} is not supported; supported: "
                      f"{supported_architectures()}")


def family_for_model_config(config: ModelConfig) -> ModelFamily:
    """The family ``config`` declares (``model.family``; for a config written before that field, the family its
    shape had: :func:`megatron_bridge.config.families.resolved_family`).

    Raises:
        BridgeError: the model is not one its family's Hugging Face mapping can express (names the family).
    """
    family = family_by_name(registry.resolved_family(config))
    if not family.matches(config):
        raise BridgeError(f"the model (model.family={family.name!r}, normalization={config.normalization!r}, "
                          f"activation={config.activation!r}, qk_layernorm={config.qk_layernorm}, "
                          f"num_moe_experts={config.num_moe_experts}) is not a {family.name} model its Hugging Face "
                          f"mapping ({family.architectures[0]}) can express; families: {family_names()}")
    return family
