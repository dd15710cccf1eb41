"""A Megatron FSDP ``fsdp_dtensor`` checkpoint (the megatron-core engine under ``dist.use_megatron_fsdp``) trains on
the native engine (issue 26 item 3), in one process: as ``pretrained_checkpoint`` and as ``checkpoint.load`` (with
``load_optim=False``) it gives bit-equal weights through the on-the-fly conversion
(``checkpoint/mcore_megatron_fsdp_weights.py``, ``bridge/cross_engine.py``); what does not convert is refused.

The folder is written here with DCP directly, as Megatron-Bridge's fsdp_dtensor save lays it out
(``checkpoint/mcore_megatron_fsdp.py``): ``checkpoint_version``, ``iteration``, ``model.module.<GPTModel name>`` under
the names megatron-core's own ``GPTModel.state_dict()`` gives (taken from a real TP=1 model, local or
transformer-engine layer-norm names), each SwiGLU ``linear_fc1.weight`` split into ``weight_w`` (gate rows) /
``weight_v`` (up rows) as megatron-core's ``handle_swiglu_in_state_dict`` does, and optimizer state and RNG states
beside them. Saving such folders under torchrun runs in tests/functional_tests/mcore/test_wrappers.py."""

from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp

from megatron_bridge.errors import CheckpointError
from tests.unit_tests.checkpoint.toy import build_run, full_weights, tiny_cfg, train


pytest.importorskip("megatron.core", reason="megatron-core checkpoints (Python 3.12 environment)")

from megatron_bridge.checkpoint.mcore_megatron_fsdp_weights import read_model_weights  # noqa: E402


STEP = 2
_TE_NAMES = {".input_layernorm.weight": ".self_attention.linear_qkv.layer_norm_weight",
             ".pre_mlp_layernorm.weight": ".mlp.linear_fc1.layer_norm_weight"}


def _gpt_state(weights: dict[str, torch.Tensor], cfg) -> dict[str, torch.Tensor]:  # noqa: ANN001
    """``weights`` (native) under megatron-core's ``GPTModel`` names, checked against a real TP=1 ``GPTModel``'s
    state dict keys and shapes."""
    from megatron_bridge.bridge.engine_checkpoints import _one_process_mcore, _tp1_model, _weights
    from megatron_bridge.engines.megatron_core.weights import native_to_megatron_core

    state = native_to_megatron_core(weights, cfg.model)
    with _one_process_mcore():
        real = _weights(_tp1_model(cfg.model, cfg.model.padded_vocab_size))
    assert {k: tuple(v.shape) for k, v in state.items()} == {k: tuple(v.shape) for k, v in real.items()}
    return state


def _fsdp_dtensor_model(state: dict[str, torch.Tensor], te_names: bool) -> dict[str, torch.Tensor]:
    """The ``model`` entry of an fsdp_dtensor state dict (``MegatronFSDP``'s ``module.`` level, SwiGLU split)."""
    model: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        if name.endswith(".mlp.linear_fc1.weight"):
            model[f"module.{name}_w"], model[f"module.{name}_v"] = (t.clone() for t in torch.chunk(tensor, 2))
            continue
        for local, te in _TE_NAMES.items():
            if te_names and name.endswith(local):
                name = name[:-len(local)] + te
        model[f"module.{name}"] = tensor.clone()
    return model


def write_fsdp_dtensor(root: Path, model: dict[str, torch.Tensor]) -> Path:
    """A Megatron-Bridge-like fsdp_dtensor checkpoint (no manifest, no train_state.pt) at step ``STEP``."""
    first = next(iter(model))
    state = {"checkpoint_version": 3.0, "iteration": STEP, "model": model,
             "optimizer": {"state": {first: {"exp_avg": torch.zeros_like(model[first]), "step": torch.tensor(2.0)}},
                           "param_to_group_meta": {first: {"lr": 1e-2}}},
             "rng_state": {"(0, 0)": [{"random_rng_state": torch.tensor([1, 2])}]}}
    folder = root / f"iter_{STEP:07d}"
    dcp.save(state, storage_writer=dcp.FileSystemWriter(str(folder)), no_dist=True)
    (root / "latest_checkpointed_iteration.txt").write_text(str(STEP))
    return folder


@pytest.fixture(scope="module")
def native_weights() -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """A native run's weights after 2 steps and the same weights under megatron-core's ``GPTModel`` names."""
    run = build_run(tiny_cfg())
    train(run, 2)
    weights = full_weights(run)
    return weights, _gpt_state(weights, run.cfg)


def _assert_equal(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert got.keys() == want.keys()
    for name, tensor in want.items():
        assert got[name].dtype == tensor.dtype and torch.equal(got[name], tensor), name


@pytest.mark.parametrize("te_names", [False, True])
def test_fsdp_dtensor_as_pretrained_on_native_is_exact(native_weights, tmp_path, te_names) -> None:  # noqa: ANN001
    weights, gpt = native_weights
    folder = write_fsdp_dtensor(tmp_path / "mfsdp", _fsdp_dtensor_model(gpt, te_names))
    run = build_run(tiny_cfg(pretrained_checkpoint=str(folder), save=str(tmp_path / "run")), seed=3)
    assert run.manager.load() and run.state.step == 0
    _assert_equal(full_weights(run), weights)
    assert not list((tmp_path / "run").glob(".converted-*"))  # the converted copy is gone once loaded


def test_fsdp_dtensor_resumes_on_native_without_its_optimizer(native_weights, tmp_path) -> None:  # noqa: ANN001
    """``checkpoint.load``: its optimizer state does not convert (the error names ``load_optim=False``); with it,
    the weights exactly and the step of the folder."""
    weights, gpt = native_weights
    root = tmp_path / "mfsdp"
    write_fsdp_dtensor(root, _fsdp_dtensor_model(gpt, te_names=False))
    with pytest.raises(CheckpointError, match=r"checkpoint\.load_optim=False"):
        build_run(tiny_cfg(load=str(root)), seed=3).manager.load()
    run = build_run(tiny_cfg(load=str(root), load_optim=False), seed=3)
    assert run.manager.load() and run.state.step == STEP
    _assert_equal(full_weights(run), weights)


def test_reader_joins_swiglu_halves_in_stored_dtypes(native_weights, tmp_path) -> None:  # noqa: ANN001
    """megatron-core names back, ``[gate; up]`` joined, each tensor in its stored dtype (bf16 here)."""
    _, gpt = native_weights
    bf16 = {k: v.to(torch.bfloat16) for k, v in gpt.items()}
    folder = write_fsdp_dtensor(tmp_path, _fsdp_dtensor_model(bf16, te_names=True))
    _assert_equal(read_model_weights(folder), bf16)


def _unconvertible(change: str, model: dict[str, torch.Tensor]) -> dict[str, object]:
    model = dict(model)
    if change == "half_pair":
        model.pop(next(k for k in model if k.endswith("linear_fc1.weight_v")))
    if change == "uneven_pair":
        key = next(k for k in model if k.endswith("linear_fc1.weight_v"))
        model[key] = model[key][:-1].clone()
    if change == "expert":
        model["module.decoder.layers.0.mlp.experts.linear_fc2.weight0"] = torch.zeros(2, 2)
    if change == "chunks":  # Megatron's virtual pipeline stages: model0, model1, ...
        return {"checkpoint_version": 3.0, "model0": model, "model1": model}
    if change == "no_model":
        return {"checkpoint_version": 3.0, "optimizer": {"state": {"x": torch.zeros(1)}}}
    return {"checkpoint_version": 3.0, "model": model}


@pytest.mark.parametrize(("change", "expected"), [
    ("half_pair", r"holds only .*linear_fc1\.weight_w of the SwiGLU pair"),
    ("uneven_pair", r"SwiGLU halves of different shapes"),
    ("expert", r"MoE expert weights"),
    ("chunks", r"several model chunks"),
    ("no_model", r"holds no model weights"),
])
def test_what_does_not_convert_is_refused(native_weights, tmp_path, change, expected) -> None:  # noqa: ANN001
    _, gpt = native_weights
    state = _unconvertible(change, _fsdp_dtensor_model(gpt, te_names=False))
    dcp.save(state, storage_writer=dcp.FileSystemWriter(str(tmp_path / "ckpt")), no_dist=True)
    with pytest.raises(CheckpointError, match=expected):
        read_model_weights(tmp_path / "ckpt")


def test_a_checkpoint_that_does_not_fit_the_model_is_named(native_weights, tmp_path) -> None:  # noqa: ANN001
    _, gpt = native_weights
    folder = write_fsdp_dtensor(tmp_path / "mfsdp", _fsdp_dtensor_model(gpt, te_names=False))
    cfg = tiny_cfg(pretrained_checkpoint=str(folder))
    cfg.model.num_query_groups = 4  # the fused QKV rows no longer split into this model's heads
    with pytest.raises(CheckpointError, match="does not fit"):
        build_run(cfg, seed=3).manager.load()


def test_convert_script_reads_and_converts_fsdp_dtensor(native_weights, tmp_path) -> None:  # noqa: ANN001
    """``scripts/checkpoint/convert.py`` (``bridge/convert.py``): the weights of an fsdp_dtensor checkpoint (with the
    model config, as for any megatron-core checkpoint) and ``--to megatron`` into a native checkpoint, exactly."""
    from megatron_bridge.bridge.convert import convert_weights
    from megatron_bridge.bridge.convert import read_model_weights as read_any

    weights, gpt = native_weights
    root = tmp_path / "mfsdp"
    write_fsdp_dtensor(root, _fsdp_dtensor_model(gpt, te_names=False))
    model = tiny_cfg().model
    _assert_equal(read_any(root, model_config=model), weights)
    native = convert_weights(root, tmp_path / "native", "megatron", model_config=model)
    _assert_equal(read_any(native), weights)
