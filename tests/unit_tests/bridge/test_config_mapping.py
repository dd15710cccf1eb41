"""Config mapping both ways for every recipe we ship, and export from checkpoints of every format and backend."""

import logging
import warnings

import pytest
import torch

from megatron_bridge import AutoBridge
from megatron_bridge.bridge.families import family_for_model_config
from megatron_bridge.bridge.pretrained import first_mismatch
from megatron_bridge.config.checkpoint import CheckpointConfig
from megatron_bridge.recipes import RECIPES
from tests.unit_tests.bridge.hf_models import VOCAB, hf_logits, hf_model, our_logits
from tests.unit_tests.checkpoint.toy import build_run, train


HF_RECIPES = sorted(name for name in RECIPES if name.startswith(("llama3", "qwen3")))


@pytest.mark.parametrize("fmt", ["rope_parameters", "rope_scaling"])
@pytest.mark.parametrize("recipe", HF_RECIPES)
def test_every_recipe_maps_to_hf_and_back(recipe, fmt, caplog) -> None:  # noqa: ANN001
    """ModelConfig → config.json → transformers config (no warnings) → ModelConfig: nothing changes."""
    from transformers import AutoConfig

    model_cfg = RECIPES[recipe].fn().model
    family = family_for_model_config(model_cfg)
    hf = family.config_to_hf(model_cfg, rope_format=fmt)
    back = family.config_from_hf(hf)
    assert first_mismatch(model_cfg, back) is None
    assert back.max_position_embeddings == (model_cfg.max_position_embeddings or model_cfg.seq_length)
    with warnings.catch_warnings(record=True) as caught, caplog.at_level(logging.WARNING):
        warnings.simplefilter("always")
        loaded = AutoConfig.for_model(**hf)
    assert not [r.getMessage() for r in caplog.records], [r.getMessage() for r in caplog.records]
    assert not [w for w in caught if "transformers" in str(w.filename)]
    assert first_mismatch(model_cfg, AutoBridge.from_hf_config(loaded).to_megatron_provider(load_weights=False)) is None


@pytest.mark.parametrize(("backend", "ckpt_format"), [("ddp", "torch_dist"), ("ddp", "torch"),
                                                      ("fsdp2", "fsdp_dtensor")])
def test_export_from_every_checkpoint_format(backend, ckpt_format, tmp_path) -> None:  # noqa: ANN001
    """FSDP2 DTensor shards, DDP DCP and single-file checkpoints export to the same exact HF folder."""
    src = tmp_path / "src"
    hf_model("qwen3-tied").save_pretrained(src)
    cfg_model = AutoBridge.from_hf_pretrained(src).to_megatron_provider()
    from megatron_bridge.config.container import ConfigContainer

    cfg = ConfigContainer(model=cfg_model, checkpoint=CheckpointConfig(save=str(tmp_path / "ck"),
                                                                       ckpt_format=ckpt_format))
    cfg.dist.use_torch_fsdp2 = backend == "fsdp2"
    cfg.model.seq_length = cfg.dataset.seq_length = 16
    run = build_run(cfg, seed=2)
    train(run, 1)
    run.manager.save()
    out = AutoBridge.export_ckpt(tmp_path / "ck", tmp_path / "out")
    tokens = torch.randint(0, VOCAB, (1, 12), generator=torch.Generator().manual_seed(3))
    with run.backend.forward_context():
        ours = our_logits(run.backend.chunks[0], tokens)
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    assert (hf_logits(hf, tokens) - ours).abs().max() <= 1e-5


def test_wrap_with_ddp_returns_wrapped_chunks(tmp_path) -> None:  # noqa: ANN001
    hf_model("llama3").save_pretrained(tmp_path)
    chunks = AutoBridge.from_hf_pretrained(tmp_path).to_megatron_model(wrap_with_ddp=True)
    tokens = torch.randint(0, VOCAB, (1, 12), generator=torch.Generator().manual_seed(3))
    assert (our_logits(chunks[0], tokens) - hf_logits(hf_model("llama3"), tokens)).abs().max() <= 1e-5


def test_a_pretrained_folder_with_another_window_is_named() -> None:
    """checkpoint.pretrained_checkpoint: the sliding window counts among the fields that must agree (a list from
    Python equals the tuple read from config.json)."""
    from megatron_bridge.bridge.pretrained import first_mismatch
    from megatron_bridge.recipes import tiny_mistral_pretrain_config

    hf_side = tiny_mistral_pretrain_config().model
    ours = tiny_mistral_pretrain_config().model
    ours.window_size = [31, 0]  # type: ignore[assignment]
    assert first_mismatch(ours, hf_side) is None
    ours.window_size = None
    assert first_mismatch(ours, hf_side) == ("window_size", None, (31, 0), "sliding_window")
