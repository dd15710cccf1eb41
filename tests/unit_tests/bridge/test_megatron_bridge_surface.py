"""AutoBridge and its provider with Megatron-Bridge's surface (NVIDIA-NeMo/Megatron-Bridge at 067f987:
``src/megatron/bridge/models/conversion/auto_bridge.py``, ``src/megatron/bridge/models/model_provider.py``, its
README's conversion quickstart), on a tiny local Llama folder, in one process (gloo on the CPU)."""

import inspect
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

from megatron_bridge.bridge import AutoBridge
from megatron_bridge.bridge.provider import GPTModelProvider, distributed_run_config
from megatron_bridge.config.model import ModelConfig
from megatron_bridge.errors import BridgeError, ConfigValidationError
from tests.unit_tests.bridge.hf_models import hf_model, write_tokenizer


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Llama 3.2-style (tied embeddings) HF folder with a tokenizer, one safetensors file."""
    folder = tmp_path_factory.mktemp("hf")
    hf_model("llama3.2-tied").save_pretrained(folder)
    write_tokenizer(folder)
    return folder


def _hf_tensors(folder: Path) -> dict[str, torch.Tensor]:
    tensors: dict[str, torch.Tensor] = {}
    for file in sorted(folder.glob("*.safetensors")):
        tensors.update(load_file(str(file)))
    return tensors


def _unwrapped(chunk: torch.nn.Module) -> torch.nn.Module:
    return chunk.module if isinstance(chunk, torch.nn.parallel.DistributedDataParallel) else chunk


def test_readme_conversion_quickstart_runs_unchanged(hf_folder: Path, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """Megatron-Bridge's README "Conversion-only quickstart", line for line; the only changes: the package name
    (``megatron.bridge`` → ``megatron_bridge``) and the Hub id → the local folder."""
    monkeypatch.chdir(tmp_path)
    local_folder = str(hf_folder)
    # ---- README, unchanged from here
    from megatron_bridge import AutoBridge

    # 1) Create a bridge from a Hugging Face model (hub or local path)
    bridge = AutoBridge.from_hf_pretrained(local_folder, trust_remote_code=True)

    # 2) Get a Megatron provider and configure parallelism before instantiation
    provider = bridge.to_megatron_provider()
    provider.tensor_model_parallel_size = 1
    provider.pipeline_model_parallel_size = 1
    provider.finalize()
    # 3) Materialize Megatron Core model(s)
    model = provider.provide_distributed_model(wrap_with_ddp=False)

    # 4a) Export Megatron → Hugging Face (full HF folder with config/tokenizer/weights)
    bridge.save_hf_pretrained(model, "./hf_exports/llama32_1b")

    # 4b) Or stream only weights (Megatron → HF)
    for name, weight in bridge.export_hf_weights(model, cpu=True):
        print(name, tuple(weight.shape))
    # ---- README ends
    source = _hf_tensors(hf_folder)
    printed = capsys.readouterr().out.splitlines()
    assert sorted(printed) == sorted(f"{n} {tuple(t.shape)}" for n, t in source.items())
    exported = _hf_tensors(tmp_path / "hf_exports" / "llama32_1b")
    assert exported.keys() == source.keys() and all(torch.equal(exported[n], source[n]) for n in source)
    assert (tmp_path / "hf_exports" / "llama32_1b" / "tokenizer.json").is_file()


def test_to_megatron_model_wraps_in_ddp_by_default(hf_folder: Path) -> None:
    bridge = AutoBridge.from_hf_pretrained(hf_folder)
    wrapped = bridge.to_megatron_model()
    assert isinstance(wrapped[0], torch.nn.parallel.DistributedDataParallel)
    plain = bridge.to_megatron_model(wrap_with_ddp=False)
    assert not isinstance(plain[0], torch.nn.parallel.DistributedDataParallel)
    for (name, a), (_, b) in zip(_unwrapped(wrapped[0]).state_dict().items(), plain[0].state_dict().items(),
                                 strict=True):
        assert torch.equal(a, b), name


# Megatron-Bridge's provide_distributed_model keywords and defaults at 067f987 (model_provider.py).
MB_PROVIDE_DEFAULTS = {
    "ddp_config": None, "model_type": "<ModelType.encoder_or_decoder>",
    "overlap_param_gather_with_optimizer_step": False,
    "fp16": None, "bf16": None, "use_megatron_fsdp": False, "use_torch_fsdp2": False, "wrap_with_ddp": True,
    "data_parallel_random_init": False, "use_cpu_initialization": False, "init_model_with_meta_device": None,
    "pre_wrap_hook": None, "post_wrap_hook": None, "mixed_precision_wrapper": "Float16Module", "pg_collection": None,
}


def test_provide_distributed_model_has_megatron_bridge_keywords_and_defaults() -> None:
    params = inspect.signature(GPTModelProvider.provide_distributed_model).parameters
    assert list(params)[1:] == list(MB_PROVIDE_DEFAULTS)
    for name, default in MB_PROVIDE_DEFAULTS.items():
        if name not in ("model_type", "mixed_precision_wrapper"):  # megatron-core objects there; ours: see below
            assert params[name].default == default, name
    assert params["model_type"].default is None  # decoder-only: accepted either way
    assert repr(params["mixed_precision_wrapper"].default) == "Float16Module"  # the engine's own wrapper


def test_keywords_map_onto_the_run_config() -> None:
    from megatron.core.distributed import DistributedDataParallelConfig

    model = AutoBridge.from_hf_config(hf_model("llama3").config).get_model_config()
    mcore_ddp = DistributedDataParallelConfig(grad_reduce_in_fp32=True, overlap_grad_reduce=True, bucket_size=1234)
    cfg = distributed_run_config(model, ddp_config=mcore_ddp, bf16=True, use_megatron_fsdp=True,
                                 init_model_with_meta_device=True)
    assert (cfg.ddp.grad_reduce_in_fp32, cfg.ddp.overlap_grad_reduce, cfg.ddp.bucket_size) == (True, True, 1234)
    assert cfg.mixed_precision.bf16 and cfg.dist.use_megatron_fsdp and not cfg.dist.use_torch_fsdp2  # the preset
    assert cfg.model.init_model_with_meta_device and not model.init_model_with_meta_device
    assert type(cfg.model) is ModelConfig
    fp16 = distributed_run_config(model, fp16=True, use_torch_fsdp2=True)
    assert fp16.mixed_precision.fp16 and fp16.dist.use_torch_fsdp2
    assert distributed_run_config(model).ddp == type(cfg.ddp)()


def test_megatron_core_engine_gets_the_mapped_config(monkeypatch: pytest.MonkeyPatch) -> None:
    """model.engine='megatron_core': the engine builds the chunks from the mapped config (its CUDA-only build is
    replaced by a recorder), the pre-wrap hooks run on them, nothing is wrapped with wrap_with_ddp=False."""
    from megatron_bridge.engines.megatron_core.engine import MegatronCoreEngine

    seen: dict[str, Any] = {}
    built = [torch.nn.Linear(2, 2)]

    def build(self: Any, cfg: Any, device: torch.device, pp_rank: int) -> list[torch.nn.Module]:
        seen.update(cfg=cfg, device=device, pp_rank=pp_rank)
        return built

    monkeypatch.setattr(MegatronCoreEngine, "build_model_chunks", build)
    provider = AutoBridge.from_hf_config(hf_model("llama3").config).to_megatron_provider(load_weights=False)
    provider.engine = "megatron_core"
    hooked: list[Any] = []
    provider.register_pre_wrap_hook(lambda chunks: hooked.append(chunks) or chunks)
    out = provider.provide_distributed_model(wrap_with_ddp=False, bf16=True, use_cpu_initialization=True)
    assert out is built and hooked == [built]
    assert seen["cfg"].model.engine == "megatron_core" and seen["cfg"].mixed_precision.bf16
    assert seen["device"] == torch.device("cpu") and seen["pp_rank"] == 0


@pytest.mark.parametrize(("kwargs", "name"), [
    ({"data_parallel_random_init": True}, "data_parallel_random_init"),
    ({"overlap_param_gather_with_optimizer_step": True}, "overlap_param_gather_with_optimizer_step"),
    ({"mixed_precision_wrapper": None}, "mixed_precision_wrapper"),
    ({"pg_collection": object()}, "pg_collection"),
    ({"fp16": True, "bf16": True}, "fp16"),
])
def test_options_that_cannot_be_honoured_are_named(kwargs: dict[str, Any], name: str) -> None:
    provider = AutoBridge.from_hf_config(hf_model("llama3").config).to_megatron_provider(load_weights=False)
    with pytest.raises(ConfigValidationError, match=name):
        provider.provide_distributed_model(**kwargs)


def test_finalize_refuses_a_bad_layout_without_rewriting() -> None:
    provider = AutoBridge.from_hf_config(hf_model("llama3").config).to_megatron_provider(load_weights=False)
    provider.finalize()
    provider.num_attention_heads = 3  # 32 hidden / 3 heads
    with pytest.raises(ConfigValidationError):
        provider.finalize()
    assert provider.num_attention_heads == 3


def test_config_only_bridge_needs_load_weights_false() -> None:
    bridge = AutoBridge.from_hf_config(hf_model("llama3").config)
    with pytest.raises(BridgeError, match="load_weights=False"):
        bridge.to_megatron_provider()
    provider = bridge.to_megatron_provider(load_weights=False)
    assert isinstance(provider, GPTModelProvider) and isinstance(provider, ModelConfig)
    assert type(bridge.get_model_config()) is ModelConfig and bridge.get_model_config() == provider


def test_get_model_loads_the_weights(hf_folder: Path) -> None:
    bridge = AutoBridge.from_hf_pretrained(hf_folder)
    model = bridge.get_model(wrap_with_ddp=False)
    source = _hf_tensors(hf_folder)
    assert torch.equal(model[0].state_dict()["norm.weight"], source["model.norm.weight"])
    with pytest.raises(BridgeError, match="load_weights=True"):
        bridge.get_model(load_weights=False, hf_path=hf_folder)


def test_load_hf_weights_allowed_mismatched_params(hf_folder: Path, tmp_path: Path) -> None:
    folder = tmp_path / "lacking"
    hf_model("llama3.2-tied").save_pretrained(folder)
    tensors = load_file(str(folder / "model.safetensors"))
    gone = "model.layers.1.mlp.down_proj.weight"
    del tensors[gone]
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    bridge = AutoBridge.from_hf_pretrained(hf_folder)
    model = bridge.to_megatron_model(load_weights=False, wrap_with_ddp=False)
    before = model[0].state_dict()["layers.1.mlp.down_proj.weight"].clone()
    with pytest.raises(BridgeError, match="lacks"):
        bridge.load_hf_weights(model, folder)
    assert bridge.load_hf_weights(model, folder, allowed_mismatched_params=["layers.1.mlp.*"]) is model
    state = model[0].state_dict()
    assert torch.equal(state["layers.1.mlp.down_proj.weight"], before)  # kept its own value
    assert torch.equal(state["layers.1.mlp.up_proj.weight"], tensors["model.layers.1.mlp.up_proj.weight"])


def test_save_and_load_megatron_model_round_trip(hf_folder: Path, tmp_path: Path) -> None:
    bridge = AutoBridge.from_hf_pretrained(hf_folder)
    model = bridge.to_megatron_model(wrap_with_ddp=False)
    bridge.save_megatron_model(model, tmp_path / "ckpt")
    assert (tmp_path / "ckpt" / "iter_0000000" / "hf_assets" / "tokenizer.json").is_file()
    loaded = bridge.load_megatron_model(tmp_path / "ckpt")
    assert not isinstance(loaded[0], torch.nn.parallel.DistributedDataParallel)
    for (name, a), (_, b) in zip(model[0].state_dict().items(), loaded[0].state_dict().items(), strict=True):
        assert torch.equal(a, b), name
    with pytest.raises(BridgeError, match="model-parallel field"):
        bridge.load_megatron_model(tmp_path / "ckpt", mp_overrides={"hidden_size": 64})


def test_load_megatron_model_takes_dtypes_in_mp_overrides(hf_folder: Path, tmp_path: Path) -> None:
    """Megatron-Bridge's examples pass torch dtypes (and ``bf16``) in ``mp_overrides``."""
    bridge = AutoBridge.from_hf_pretrained(hf_folder)
    model = bridge.to_megatron_model(wrap_with_ddp=False)
    bridge.save_megatron_model(model, tmp_path / "ckpt")
    loaded = bridge.load_megatron_model(tmp_path / "ckpt", mp_overrides={
        "tensor_model_parallel_size": 1, "params_dtype": torch.bfloat16, "pipeline_dtype": torch.bfloat16,
        "bf16": True, "fp16": False})
    norm = loaded[0].state_dict()["norm.weight"]
    assert norm.dtype == torch.bfloat16
    assert torch.equal(norm, model[0].state_dict()["norm.weight"].to(torch.bfloat16))
    with pytest.raises(BridgeError, match="bf16=True means params_dtype 'bfloat16'"):
        bridge.load_megatron_model(tmp_path / "ckpt", mp_overrides={"bf16": True, "params_dtype": torch.float32})
    with pytest.raises(BridgeError, match=r"use one of \['float32', 'bfloat16', 'float16'\]"):
        bridge.load_megatron_model(tmp_path / "ckpt", mp_overrides={"params_dtype": torch.int8})


def test_hf_pretrained_reads_the_folder(hf_folder: Path) -> None:
    """``bridge.hf_pretrained.state[name]`` and ``.tokenizer``, as Megatron-Bridge's conversion examples use them."""
    bridge = AutoBridge.from_hf_pretrained(hf_folder)
    pretrained = bridge.hf_pretrained
    source = _hf_tensors(hf_folder)
    assert set(pretrained.state) == set(source) and len(pretrained.state) == len(source)
    assert torch.equal(pretrained.state["model.norm.weight"], source["model.norm.weight"])
    assert "nonexistent" not in pretrained.state
    assert pretrained.config.num_hidden_layers == bridge.hf_config["num_hidden_layers"]
    assert pretrained.tokenizer("hello")["input_ids"]
    assert pretrained.model_name_or_path == str(hf_folder) and bridge.hf_pretrained is pretrained
    with pytest.raises(BridgeError, match="from_hf_pretrained"):
        _ = AutoBridge.from_hf_config(bridge.hf_config).hf_pretrained


def test_save_hf_weights_writes_weights_only(hf_folder: Path, tmp_path: Path) -> None:
    bridge = AutoBridge.from_hf_pretrained(hf_folder)
    bridge.save_hf_weights(bridge.to_megatron_model(wrap_with_ddp=False), tmp_path / "w")
    assert sorted(p.name for p in (tmp_path / "w").iterdir()) == ["model.safetensors"]
    source, saved = _hf_tensors(hf_folder), _hf_tensors(tmp_path / "w")
    assert saved.keys() == source.keys() and all(torch.equal(saved[n], source[n]) for n in source)


def test_conversion_tasks_and_partial_export(hf_folder: Path) -> None:
    bridge = AutoBridge.from_hf_pretrained(hf_folder)
    model = bridge.to_megatron_model(wrap_with_ddp=False)
    tasks = bridge.get_conversion_tasks(model)
    assert {t.mapping.hf_param for t in tasks} == set(_hf_tensors(hf_folder))
    assert all(t.megatron_module is model[0] and t.pp_rank == 0 and t.vp_stage is None for t in tasks)
    norm = [t for t in tasks if t.param_name == "norm.weight"]
    assert [n for n, _ in bridge.export_hf_weights(model, conversion_tasks=norm)] == ["model.norm.weight"]


def test_transformer_config_is_megatron_cores(hf_folder: Path) -> None:
    config = AutoBridge.from_hf_pretrained(hf_folder).transformer_config
    assert type(config).__name__ == "TransformerConfig"
    assert (config.num_layers, config.hidden_size, config.num_query_groups) == (2, 32, 2)
