"""Unit tests of the model provider: chunks, meta-device build and materialization, engine and layout errors."""

from dataclasses import replace

import pytest
import torch
from tests.unit_tests.models.configs import tiny
from torch import nn

from megatron_bridge.errors import ConfigValidationError
from megatron_bridge.models import build_model_chunks, materialize_meta_model
from megatron_bridge.models.llama import LlamaModel
from megatron_bridge.models.validation import check_model_buildable


def test_one_chunk_on_cpu() -> None:
    chunks = build_model_chunks(tiny(), device="cpu")
    assert len(chunks) == 1 and isinstance(chunks[0], LlamaModel)
    assert all(p.device.type == "cpu" for p in chunks[0].parameters())


def _assert_same_state(a: nn.Module, b: nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for key in sa:
        assert sa[key].dtype == sb[key].dtype, key
        assert torch.equal(sa[key], sb[key]), key
    for (name, x), (_, y) in zip(a.named_buffers(), b.named_buffers()):
        assert torch.equal(x, y), name


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"share_embeddings_and_output_weights": True, "qk_layernorm": True, "add_bias_linear": True},
        {"params_dtype": "bfloat16", "normalization": "LayerNorm", "rope_scaling": True},
    ],
)
def test_meta_build_then_materialize_is_bitwise_equal_to_direct_build(overrides: dict[str, object]) -> None:
    cfg = tiny(**overrides)
    torch.manual_seed(1234)
    direct = build_model_chunks(cfg)[0]

    torch.manual_seed(1234)
    meta = build_model_chunks(replace(cfg, init_model_with_meta_device=True))[0]
    assert all(p.is_meta for p in meta.parameters())
    assert materialize_meta_model(meta, "cpu") is meta
    assert not any(p.is_meta for p in meta.parameters())
    _assert_same_state(direct, meta)
    if cfg.share_embeddings_and_output_weights:
        assert meta.output_weight.data_ptr() == meta.embed_tokens.weight.data_ptr()
    ids = torch.randint(0, cfg.vocab_size, (2, 8))
    assert torch.equal(direct(ids), meta(ids))


def test_materialize_wrapper_without_init_weights_and_default_meta_context() -> None:
    cfg = tiny()
    torch.manual_seed(7)
    direct = build_model_chunks(cfg)[0]
    torch.manual_seed(7)
    with torch.device("meta"):
        inner = LlamaModel(cfg)  # device=None follows torch's default device

    class Wrapper(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.module = inner

    wrapper = materialize_meta_model(Wrapper(), torch.device("cpu"))
    _assert_same_state(direct, wrapper.module)


def test_materialize_re_ties_shared_weights() -> None:
    class Tied(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Linear(3, 3, bias=False, device="meta")
            self.b = nn.Linear(3, 3, bias=False, device="meta")
            self.b.weight = self.a.weight

        def init_weights(self) -> None:
            nn.init.ones_(self.a.weight)

        def tie_weights(self) -> None:
            self.b.weight = self.a.weight

    model = materialize_meta_model(Tied(), "cpu")
    assert model.b.weight is model.a.weight and bool((model.b.weight == 1).all())


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("expert_model_parallel_size", 2),
    ],
)
def test_unsupported_model_parallelism_raises(field: str, value: int) -> None:
    with pytest.raises(ConfigValidationError) as err:
        build_model_chunks(tiny(**{field: value}))
    assert err.value.paths == (f"model.{field}",)
    assert f"model.{field}={value}" in str(err.value) and "local engine" in str(err.value)


def test_context_parallel_size_is_accepted() -> None:
    """CP is applied by the distributed layer (apply_context_parallel); the model built here is the full model."""
    model = build_model_chunks(tiny(context_parallel_size=2))[0]
    assert model.cp_layout is None and model.layers[0].self_attn.context_parallel is None


def test_tensor_parallel_size_is_accepted_and_pads_vocab() -> None:
    model = build_model_chunks(tiny(tensor_model_parallel_size=2))[0]
    assert model.embed_tokens.weight.shape[0] == 128  # 100 padded to a multiple of 16 * 2


def test_native_engine_refuses_the_transformer_engine_spec() -> None:
    with pytest.raises(ConfigValidationError) as err:
        build_model_chunks(tiny(transformer_impl="transformer_engine"))
    message = str(err.value)
    assert "[rule transformer_impl_available]" in message and "model.engine='megatron_core'" in message
    assert "model.transformer_impl='local'" in message
    with pytest.raises(ConfigValidationError, match="native engine builds only plain PyTorch layers"):
        LlamaModel(tiny(transformer_impl="transformer_engine"))


def test_missing_transformer_engine_names_the_install(monkeypatch: pytest.MonkeyPatch) -> None:
    import megatron_bridge.utils.packages as packages

    monkeypatch.setattr(packages, "import_problem", lambda name: "not installed")
    with pytest.raises(ConfigValidationError) as err:
        check_model_buildable(tiny(engine="megatron_core", transformer_impl="transformer_engine"),
                              ("transformer_impl_available",))
    message = str(err.value)
    assert "transformer-engine" in message and "not installed" in message
    assert "pip install 'megatron-bridge[te]'" in message


def test_native_builder_refuses_megatron_core_configs() -> None:
    with pytest.raises(ConfigValidationError, match="build_gpt_chunks"):
        build_model_chunks(tiny(engine="megatron_core"))


def test_real_lookup_on_this_machine() -> None:
    # Without monkeypatching: whatever is installed, a GPU engine never silently builds the local model.
    with pytest.raises(ConfigValidationError, match="model.transformer_impl"):
        build_model_chunks(tiny(transformer_impl="megatron_core"))
