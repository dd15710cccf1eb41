"""Recipe dimensions, world sizes, keyword overrides and the import-time budget of config + recipes."""

import re
import subprocess
import sys

import pytest

from megatron_bridge.errors import ConfigValidationError
from megatron_bridge.recipes import (
    RECIPES,
    get_recipe,
    llama3_8b_16k_pretrain_config,
    llama3_8b_64k_pretrain_config,
    llama3_8b_128k_pretrain_config,
    llama3_8b_pretrain_config,
    llama3_70b_pretrain_config,
    llama31_8b_pretrain_config,
    llama31_70b_pretrain_config,
    llama31_405b_pretrain_config,
    llama32_1b_pretrain_config,
    qwen3_8b_pretrain_config,
    tiny_llama_pretrain_config,
)


H100 = (9, 0)
"""Compute capability of the GPU Megatron-Bridge's recipes are laid out for; FP8 recipes validate against it (CUDA
mocked: the boundary), and without it fail rule fp8_requirements naming the missing device."""


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_recipe_validates_at_its_world_size(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every recipe validates at its world size, except layouts the engine does not build yet (pipeline and context
    parallel recipes), which fail with exactly the rules of those layouts (as pretrain() would):
    engine_parallel_layout, and fsdp2_pipeline where TP (on FSDP2) meets PP. FP8 recipes on an H100 (mocked)."""
    import megatron_bridge.utils.packages as packages

    info = RECIPES[name]
    cfg = info.fn()
    m = cfg.model
    if cfg.finalize().mixed_precision.fp8:
        monkeypatch.setattr(packages, "cuda_capability", lambda: None)
        with pytest.raises(ConfigValidationError, match=r"needs a CUDA device.*\[rule fp8_requirements\]"):
            info.fn().validate(world_size=info.world_size)
        monkeypatch.setattr(packages, "cuda_capability", lambda: H100)
    try:
        cfg.validate(world_size=info.world_size)
    except ConfigValidationError as exc:
        allowed = {"engine_parallel_layout", "fsdp2_pipeline"}
        assert set(re.findall(r"\[rule (\w+)\]", str(exc))) <= allowed, exc
        assert m.pipeline_model_parallel_size > 1 or m.context_parallel_size > 1, exc


def test_llama3_8b_dimensions() -> None:
    m = llama3_8b_pretrain_config().model
    assert (m.num_layers, m.hidden_size, m.ffn_hidden_size) == (32, 4096, 14336)
    assert (m.num_attention_heads, m.num_query_groups, m.rotary_base) == (32, 8, 500_000.0)
    assert (m.vocab_size, m.seq_length, m.rope_scaling) == (128256, 8192, False)
    assert (m.tensor_model_parallel_size, m.pipeline_model_parallel_size, m.context_parallel_size) == (1, 1, 2)
    cfg = llama3_8b_pretrain_config()
    assert (cfg.train.global_batch_size, cfg.train.micro_batch_size) == (512, 1)
    assert (cfg.optimizer.lr, cfg.optimizer.min_lr, cfg.scheduler.lr_warmup_iters) == (3e-4, 3e-5, 2000)


def test_large_recipe_layouts() -> None:
    m = llama3_70b_pretrain_config().model
    assert (m.num_layers, m.hidden_size, m.num_attention_heads) == (80, 8192, 64)
    assert (m.tensor_model_parallel_size, m.pipeline_model_parallel_size,
            m.virtual_pipeline_model_parallel_size, m.context_parallel_size, m.sequence_parallel) == (4, 4, 5, 2, True)
    m405 = llama31_405b_pretrain_config().model
    assert (m405.num_layers, m405.context_parallel_size, m405.seq_length) == (126, 4, 131072)
    assert (llama31_70b_pretrain_config().model.context_parallel_size, llama31_8b_pretrain_config().model
            .context_parallel_size) == (2, 2)
    assert llama32_1b_pretrain_config().model.share_embeddings_and_output_weights
    q = qwen3_8b_pretrain_config().model
    assert (q.kv_channels, q.qk_layernorm, q.vocab_size, q.rotary_base) == (128, True, 151936, 1_000_000.0)


@pytest.mark.parametrize(("fn", "seq", "cp", "world"), [
    (llama3_8b_16k_pretrain_config, 16384, 2, 16),
    (llama3_8b_64k_pretrain_config, 65536, 4, 32),
    (llama3_8b_128k_pretrain_config, 131072, 8, 64),
])
def test_llama3_8b_long_context_layouts(fn, seq: int, cp: int, world: int) -> None:  # noqa: ANN001
    """Megatron-Bridge's long-context Llama 3 8B variants: TP4 PP2 CP2/4/8 with sequence parallel."""
    cfg = fn()
    m = cfg.model
    assert (m.seq_length, cfg.dataset.seq_length, m.context_parallel_size) == (seq, seq, cp)
    assert (m.tensor_model_parallel_size, m.pipeline_model_parallel_size, m.sequence_parallel) == (4, 2, True)
    assert cfg.data_parallel_size(world) == 1
    assert RECIPES[fn.__name__.removesuffix("_pretrain_config")].world_size == world


def test_recipe_keyword_overrides(tmp_path) -> None:
    cfg = tiny_llama_pretrain_config(train_iters=5, seq_length=64, dir=str(tmp_path), lr=2e-3,
                                     data_path=["0.5", "a", "0.5", "b"])
    assert cfg.train.train_iters == 5 and cfg.model.seq_length == cfg.dataset.seq_length == 64
    assert cfg.checkpoint.save == cfg.checkpoint.load == str(tmp_path / "checkpoints")
    assert cfg.logger.tensorboard_dir == str(tmp_path / "tb_logs")
    assert cfg.optimizer.lr == 2e-3 and cfg.dataset.mock is False
    with pytest.raises(ConfigValidationError, match="unknown recipe keyword 'trian_iters'"):
        tiny_llama_pretrain_config(trian_iters=5)


def test_none_keywords_set_what_none_means_and_keep_the_rest(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    recipe = llama3_70b_pretrain_config()
    assert recipe.validation.eval_interval and recipe.model.virtual_pipeline_model_parallel_size
    assert recipe.mixed_precision is not None
    cfg = llama3_70b_pretrain_config(eval_interval=None, virtual_pipeline_model_parallel_size=None,
                                     mixed_precision=None, dir=None, train_iters=None, lr=None, data_path=None)
    assert cfg.validation.eval_interval is None  # no evaluation, as Megatron-Bridge reads it
    assert cfg.model.virtual_pipeline_model_parallel_size is None and cfg.mixed_precision is None  # no VP; fp32
    assert cfg.checkpoint.save == str(tmp_path / "nemo_experiments" / "default" / "checkpoints")  # dir=None: default
    assert cfg.train.train_iters == recipe.train.train_iters and cfg.optimizer.lr == recipe.optimizer.lr
    assert cfg.dataset.mock and cfg.dataset.data_path is None
    cfg.validate(world_size=64)


def test_megatron_fsdp_keyword_applies_perf_overrides() -> None:
    cfg = llama3_8b_pretrain_config(use_megatron_fsdp=True)
    assert cfg.ddp.data_parallel_sharding_strategy == "optim_grads_params"
    assert cfg.checkpoint.ckpt_format == "fsdp_dtensor" and cfg.checkpoint.load is None
    cfg.validate(world_size=2)
    assert cfg.dist.use_megatron_fsdp and cfg.ddp.use_megatron_fsdp


def test_get_recipe() -> None:
    assert get_recipe("llama3_8b_pretrain_config").fn is llama3_8b_pretrain_config
    with pytest.raises(ConfigValidationError, match="unknown recipe"):
        get_recipe("llama9")


def test_config_and_recipes_import_light_and_fast() -> None:
    code = (
        "import sys, time; t = time.process_time();"
        "from megatron_bridge.recipes import llama3_8b_pretrain_config as f; f().validate(world_size=2);"
        "dt = time.process_time() - t;"
        "heavy = [m for m in ('torch', 'megatron_fsdp', 'megatron', 'tensorboard', 'transformer_engine') "
        "if m in sys.modules];"
        "print(dt, heavy)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split(" ", 1)
    assert out[1].strip() == "[]", f"heavy modules imported: {out[1]}"
    # CPU time, not wall time: a loaded machine (CI runners, parallel test jobs) stretches wall time, not the work
    # done; importing torch alone costs several CPU seconds, so 0.5 s still catches a heavy import.
    assert float(out[0]) < 0.5


def test_qwen3_training_values_are_megatron_bridges() -> None:
    """Megatron-Bridge's Qwen3 recipes: its _pretrain_common training values (8B: its 16-GPU convergence values,
    test_recipes_megatron_bridge.py), no sequence parallelism, recompute only for 32B."""
    from megatron_bridge.recipes import qwen3_4b_pretrain_config, qwen3_32b_pretrain_config

    for fn in (qwen3_4b_pretrain_config, qwen3_32b_pretrain_config):
        cfg = fn()
        assert (cfg.train.train_iters, cfg.train.global_batch_size, cfg.train.micro_batch_size) == (300_000, 32, 2)
        assert cfg.scheduler.lr_warmup_iters == 500
        assert (cfg.validation.eval_interval, cfg.validation.eval_iters) == (500, 32)
        assert (cfg.optimizer.lr, cfg.optimizer.min_lr) == (3e-4, 3e-5)
        assert cfg.model.sequence_parallel is False
        assert cfg.dist.use_torch_fsdp2 is (cfg.model.tensor_model_parallel_size > 1)  # TP: FSDP2 (recipes/base.py)
    assert qwen3_8b_pretrain_config().model.recompute_granularity is None
    m = qwen3_32b_pretrain_config().model
    assert (m.recompute_granularity, m.recompute_method, m.recompute_num_layers) == ("full", "uniform", 1)


def test_llama31_sequence_lengths_and_context_parallel() -> None:
    from megatron_bridge.recipes import llama31_8b_pretrain_config, llama31_70b_pretrain_config

    m8, m70, m405 = (fn().model for fn in (llama31_8b_pretrain_config, llama31_70b_pretrain_config,
                                           llama31_405b_pretrain_config))
    assert (m8.seq_length, m8.context_parallel_size) == (8192, 2)
    assert (m70.seq_length, m70.context_parallel_size, m70.tensor_model_parallel_size) == (131072, 2, 4)
    assert (m405.seq_length, m405.context_parallel_size, m405.pipeline_model_parallel_size) == (131072, 4, 8)


def test_default_run_folder(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without dir, checkpoints and TensorBoard go to <cwd>/nemo_experiments/default, as in Megatron-Bridge."""
    monkeypatch.chdir(tmp_path)
    cfg = llama3_8b_pretrain_config()
    run = tmp_path / "nemo_experiments" / "default"
    assert cfg.checkpoint.save == cfg.checkpoint.load == str(run / "checkpoints")
    assert cfg.logger.tensorboard_dir == str(run / "tb_logs")
    other = llama3_8b_pretrain_config(dir=str(tmp_path / "mine"))
    assert other.checkpoint.save == str(tmp_path / "mine" / "checkpoints")
    assert not run.exists()  # a recipe call creates nothing
