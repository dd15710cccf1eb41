"""The memory/FLOPs model against hand counts, and the dry-run table of every recipe (pure arithmetic, no torch)."""

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from megatron_bridge.config.container import ConfigContainer
from megatron_bridge.config.model import ModelConfig
from megatron_bridge.config.train import TrainingConfig
from megatron_bridge.errors import ConfigValidationError
from megatron_bridge.perf.estimate import dry_run_report, estimate_step, gpu_key, knobs
from megatron_bridge.perf.layout import layout_of
from megatron_bridge.perf.memory import estimate_memory
from megatron_bridge.recipes import RECIPES, tiny_llama_pretrain_config


REPO = Path(__file__).resolve().parents[3]


def test_tiny_ddp_fp32_one_rank_hand_count() -> None:
    """Layout 1: the tiny recipe, DDP, fp32, one rank (h 128, 4 blocks, 4/2 heads of 32, ffn 352, vocab 384)."""
    cfg = tiny_llama_pretrain_config().validate(world_size=1)
    est = estimate_memory(cfg, 1)
    block = 2 * 128 + (128 * 128 + 2 * 128 * 64 + 128 * 128) + 3 * 128 * 352
    n = 2 * 384 * 128 + 4 * block + 128
    assert est.params.total == n == 836_736
    assert (est.param_bytes, est.grad_bytes, est.optimizer_bytes) == (4 * n, 4 * n, 8 * n)
    assert est.buffer_bytes == est.persistent_buffer_bytes == 4 * n  # DDP's flat gradient buckets
    # per token and block: 2 fp32 norms (2 x 2h x 4) + attention 4 x (h + q + k + v + out + o_proj input)
    # + SwiGLU MLP 4 x (h + 4f)
    per_token_block = 2 * 2 * 128 * 4 + 4 * (128 + 128 + 64 + 64 + 2 * 128) + 4 * (128 + 4 * 352)
    assert per_token_block == 10_752
    head = 8 * 128 + 4 * 128 + 3 * 4 * 384  # final norm, lm_head input, log-softmax + two gradients
    tokens = 4 * 128
    assert est.activations.peak_bytes == tokens * (4 * per_token_block + head) == 25_165_824
    assert est.activations.in_flight == 1
    assert est.optimizer_step_bytes == 4 * n
    assert est.peak_bytes == 16 * n + 4 * n + 25_165_824


def _tp_fsdp2_config() -> ConfigContainer:
    model = ModelConfig(num_layers=2, hidden_size=256, ffn_hidden_size=512, num_attention_heads=8, num_query_groups=4,
                        vocab_size=1000, seq_length=64, tensor_model_parallel_size=2, sequence_parallel=True,
                        recompute_granularity="full")
    cfg = ConfigContainer(model=model, train=TrainingConfig(global_batch_size=16, micro_batch_size=2, train_iters=1),
                          mixed_precision="bf16_mixed")
    cfg.dataset.seq_length = 64
    cfg.dist.use_torch_fsdp2 = True
    return cfg.validate(world_size=8)


def test_fsdp2_tp2_dp4_bf16_full_recompute_hand_count() -> None:
    """Layout 2: FSDP2 x TP 2 x DP 4, bf16, sequence parallel, full recompute (vocab 1000 padded to 1024)."""
    cfg = _tp_fsdp2_config()
    est = estimate_memory(cfg, 8)
    assert (est.layout.dp, est.layout.tp, est.layout.shard_size) == (4, 2, 4)
    attention = (256 * 256 + 2 * 256 * 128 + 256 * 256) // 2 + 2 * 256  # matrices / TP, two replicated norms
    mlp = 3 * 256 * 512 // 2
    rank = 2 * (attention + mlp) + 2 * 1024 * 256 // 2 + 256
    assert est.params.total == rank == 853_248
    assert (est.param_bytes, est.grad_bytes, est.optimizer_bytes) == (4 * rank // 4, 4 * rank // 4, 8 * rank // 4)
    # full recompute keeps each block's bf16 input (sharded over TP by SP) and recomputes one block in backward
    kept = 2 * 256 // 2
    one_block = 16 * 256 // 2 + 2 * (256 + 128 + 2 * 64 + 2 * 128) + 2 * (256 + 4 * 256)
    head = 8 * 256 + 2 * 256 + 12 * 1024 + 2 * 1024  # + the bf16 logits
    assert est.activations.peak_bytes == 2 * 64 * (2 * kept + one_block + head) == 3_014_656
    assert est.activations.recompute == "full"


def test_step_flops_and_time_on_a_named_gpu() -> None:
    cfg = _tp_fsdp2_config()
    step = estimate_step(cfg, 8, "h100", mfu=0.5)
    per_token = 3 * (2 * (2 * 256 * 32 * (2 * 8 + 2 * 4) + 2 * 2 * 64 * 32 * 8 + 3 * 2 * 256 * 512) + 2 * 256 * 1024)
    assert step.flops_per_step == per_token * 16 * 64
    assert step.step_time_s == pytest.approx(per_token * 16 * 64 / (8 * 989e12 * 0.5))
    assert gpu_key("NVIDIA H200") == "H200" and gpu_key(None) == "H100"
    with pytest.raises(ConfigValidationError, match="unknown GPU 'tpu'"):
        gpu_key("tpu")


def test_largest_buffer_names_the_sharding_backend() -> None:
    fsdp2 = tiny_llama_pretrain_config(use_torch_fsdp2=True).validate(world_size=2)
    assert estimate_memory(fsdp2, 2).largest_buffer[0] == "FSDP2 all-gather (largest unit)"
    mfsdp = tiny_llama_pretrain_config(use_megatron_fsdp=True).validate(world_size=2)
    assert estimate_memory(mfsdp, 2).largest_buffer[0] == "Megatron FSDP all-gather (largest unit)"


def test_pipeline_context_and_expert_fields_are_read_when_present() -> None:
    """PP/CP/EP layouts from the config fields (set directly: the estimate needs no validation of them)."""
    cfg = tiny_llama_pretrain_config(global_batch_size=64, micro_batch_size=1).validate(world_size=1)
    base = estimate_memory(cfg, 1)
    cfg.model.pipeline_model_parallel_size = 2
    pp = estimate_memory(cfg, 2)
    assert pp.layout.pipeline_schedule == "1F1B" and pp.activations.in_flight == 2 and pp.pp_rank == 0
    assert pp.params.total < base.params.total  # two of four blocks per stage
    cfg.model.virtual_pipeline_model_parallel_size = 2
    assert estimate_memory(cfg, 2).activations.in_flight == 2 * (1 + 1 / 4)
    cfg.model.pipeline_model_parallel_size, cfg.model.virtual_pipeline_model_parallel_size = 1, None
    cfg.model.context_parallel_size = 2
    assert estimate_memory(cfg, 2).layout.tokens_per_microbatch == 64
    cfg.model.context_parallel_size = 1
    cfg.model.num_moe_experts, cfg.model.moe_ffn_hidden_size, cfg.model.expert_model_parallel_size = 8, 64, 2
    moe = estimate_memory(cfg, 2)
    assert moe.params.expert == 4 * 8 * 3 * 128 * 64 // 2
    assert moe.params.model_total == base.params.total + 4 * (8 * 3 * 128 * 64 + 128 * 8 - 3 * 128 * 352)


def test_every_recipe_has_a_dry_run_table() -> None:
    for name, info in RECIPES.items():
        cfg = info.fn().finalize()  # PP/CP recipes fail validate() (engine_parallel_layout) until they are built
        report = dry_run_report(cfg, info.world_size)
        assert all(line.startswith("# ") for line in report.splitlines()), name
        for row in ("parameters", "gradients", "optimizer state", "activations", "peak", "model FLOPs per step"):
            assert row in report, (name, row)
        assert yaml.safe_load(report) is None  # comments only: the dry-run output stays YAML


def test_warning_names_the_knobs_that_help() -> None:
    cfg = RECIPES["llama3_8b"].fn().validate(world_size=2)
    report = dry_run_report(cfg, 2, "h100")
    assert "WARNING: the largest rank needs" in report and "dist.use_torch_fsdp2=true" in report
    assert knobs(cfg, estimate_memory(cfg, 2))[0].startswith("dist.use_torch_fsdp2")
    assert "WARNING" not in dry_run_report(tiny_llama_pretrain_config().validate(world_size=1), 1)


@pytest.mark.parametrize(("world_size", "distributed_optimizer", "named"), [(2, False, True), (2, True, False),
                                                                           (1, False, False)])
def test_knobs_name_the_distributed_optimizer_for_ddp(world_size: int, distributed_optimizer: bool,
                                                      named: bool) -> None:
    """With DDP over more than one data-parallel rank and no distributed optimizer, the knobs name it (ZeRO-1);
    with it already on, or with one rank, they do not."""
    cfg = tiny_llama_pretrain_config()
    cfg.optimizer.use_distributed_optimizer = cfg.ddp.use_distributed_optimizer = distributed_optimizer
    cfg = cfg.validate(world_size=world_size)
    listed = [k for k in knobs(cfg, estimate_memory(cfg, world_size)) if k.startswith("optimizer.use_distributed")]
    assert bool(listed) is named, listed


def test_layout_reads_missing_fields_as_off() -> None:
    """A model section without the parallelism fields (an older or newer config) reads as 1 / off."""
    cfg = tiny_llama_pretrain_config().validate(world_size=2)
    cfg.model = type("M", (), {"seq_length": 128})()  # type: ignore[assignment]
    lay = layout_of(cfg, 2)
    assert (lay.tp, lay.pp, lay.cp, lay.ep, lay.vp, lay.dp) == (1, 1, 1, 1, 1, 2)


def test_run_recipe_dry_run_prints_yaml_then_the_table() -> None:
    out = subprocess.run([sys.executable, "scripts/training/run_recipe.py", "--recipe", "tiny_llama", "--dry-run",
                          "profiling.estimate_gpu=b200"], cwd=REPO, capture_output=True, text=True, check=True,
                         timeout=600).stdout
    assert yaml.safe_load(out)["model"]["hidden_size"] == 128
    assert "# on B200" in out and "#   peak" in out


def test_llama31_405b_activations_hand_count() -> None:
    """Megatron-Bridge's 405B layout (TP8 PP8 VP2 CP4 SP, 128K tokens, micro-batch 1, recompute none, bf16; the
    embedding and loss counted as layers: stages of 7, 8, ..., 8, 7 layers), counted by hand for this library's
    engine on pipeline rank 0 (stages 0 and 8: the embedding + 7 + 8 = 15 layers)."""
    cfg = RECIPES["llama31_405b"].fn().validate(world_size=256)
    est = estimate_memory(cfg, 256)
    h, tp, cp, a = 16384, 8, 4, 2  # bf16 compute
    q, kv, f = 128 * 128 // tp, 8 * 128 // tp, 53248 // tp  # per TP rank: query, key/value widths, FFN
    tokens = 131072 // cp  # one micro-batch's tokens on a CP rank
    norms = 2 * 2 * 4 * h // tp  # two RMSNorms, fp32 input and output, sequence-parallel shards
    attention = a * (h + q + 2 * kv * cp + 2 * q)  # gathered input, q, all-gathered k and v, output, o_proj input
    mlp = a * (h + 4 * f)  # gathered input, gate, silu(gate), up, their product
    per_token_layer = norms + attention + mlp
    assert per_token_layer == 165_888
    # Interleaved1F1B on rank 0: (VP-1)*PP + 2*(PP-1) = 22 warm-up forwards + 1 before the first backward = 23
    # chunk-micro-batches alive, 11.5 of the rank's two-chunk layer stacks
    assert est.pp_rank == 0 and est.activations.in_flight == 23 / 2
    boundary = 23 * 2 * a * h  # each chunk-micro-batch keeps its stage input and output
    assert est.activations.peak_bytes == tokens * (23 / 2 * 15 * per_token_layer + boundary)
    assert 910 < est.activations.peak_bytes / 2**30 < 925  # ~919 GiB: the recipe needs recompute (see docs)


def test_fsdp2_shards_expert_parallel_experts_over_edp() -> None:
    """FSDP2 × EP 2 on 4 ranks (tiny_moe): dense state sharded over the 4 data-parallel ranks, each rank's 4 of 8
    experts over its expert-data-parallel group of 2 (one FSDP2 unit per MoE layer's experts on the "edp" mesh)."""
    from megatron_bridge.recipes import tiny_moe_pretrain_config

    cfg = tiny_moe_pretrain_config(global_batch_size=16, micro_batch_size=4)
    cfg.dist.use_torch_fsdp2 = True
    est = estimate_memory(cfg.validate(world_size=4), 4)
    experts = 4 * (8 // 2) * 3 * 128 * 96  # 4 MoE layers, 4 local SwiGLU experts of width 96
    assert est.params.expert == experts
    assert est.layout.expert_shard_size == 2
    assert est.param_bytes == 4 * (est.params.dense // 4 + experts // 2)
    assert est.grad_bytes == 4 * (est.params.dense // 4 + experts // 2)
    assert est.optimizer_bytes == 8 * (est.params.dense // 4 + experts // 2)


def test_megatron_fsdp_shards_state_over_dp_times_cp() -> None:
    """Megatron FSDP at CP=2 × DP=2 shards parameters, gradients and optimizer state over the 4 dp × cp ranks (as at
    CP=1 × DP=4: megatron-fsdp's dp_cp group); each rank holds half of every sequence's tokens."""
    n = 836_736  # the tiny recipe's parameters (test_tiny_ddp_fp32_one_rank_hand_count), fp32
    estimates = {}
    for cp in (1, 2):
        cfg = tiny_llama_pretrain_config(use_megatron_fsdp=True, context_parallel_size=cp).validate(world_size=4)
        estimates[cp] = estimate_memory(cfg, 4)
    est = estimates[2]
    assert (est.layout.backend, est.layout.dp, est.layout.cp, est.layout.shard_size) == ("megatron_fsdp", 2, 2, 4)
    assert (est.param_bytes, est.grad_bytes, est.optimizer_bytes) == (4 * n // 4, 4 * n // 4, 8 * n // 4)
    base = estimates[1]
    assert (est.param_bytes, est.grad_bytes, est.optimizer_bytes) == (base.param_bytes, base.grad_bytes,
                                                                      base.optimizer_bytes)
    assert est.layout.tokens_per_microbatch * 2 == base.layout.tokens_per_microbatch


def test_pipeline_layout_sets_each_ranks_layers() -> None:
    """model.pipeline_model_parallel_layout: the estimate splits the layers as the layout says (the fuller rank is
    the largest), and an embedding-only first stage holds no layer of its own."""
    from megatron_bridge.perf.layout import pipeline_ranks

    cfg = tiny_llama_pretrain_config(global_batch_size=64, micro_batch_size=1)
    cfg.model.pipeline_model_parallel_size = 2
    cfg.model.pipeline_model_parallel_layout = "Et|tttL"
    cfg.validate(world_size=2)
    ranks = pipeline_ranks(cfg, layout_of(cfg, 2))
    assert [(r.layers, r.first, r.last) for r in ranks] == [((0,), True, False), ((1, 2, 3), False, True)]
    uneven = estimate_memory(cfg, 2)
    assert uneven.pp_rank == 1 and "3 layers in 1 chunk(s), the output layer" in " ".join(uneven.notes)
    cfg.model.pipeline_model_parallel_layout = None
    even = estimate_memory(cfg, 2)
    assert uneven.params.total > even.params.total  # three blocks and the output layer against two and one
    cfg.model.virtual_pipeline_model_parallel_size = 2
    cfg.model.pipeline_model_parallel_layout = [["embedding"], ["decoder"] * 2, ["decoder"] * 2, ["loss"]]
    ranks = pipeline_ranks(cfg, layout_of(cfg, 2))
    assert [(r.layers, r.chunks, r.first, r.last) for r in ranks] == [((2, 3), 2, True, False),
                                                                      ((0, 1), 2, False, True)]


@pytest.mark.parametrize("recipe", ["tiny_deepseek_v3", "tiny_llama"])
def test_mtp_layers_are_counted_on_the_last_rank(recipe: str) -> None:
    """With multi-token prediction the estimate holds the built model's parameters: the model total and, on one
    rank without expert parallelism, its dense + expert parameters."""
    from megatron_bridge.models.llama import LlamaModel

    cfg = RECIPES[recipe].fn(expert_model_parallel_size=1)
    cfg.model.mtp_num_layers = 2
    cfg.validate(world_size=1)
    built = sum(p.numel() for p in LlamaModel(cfg.model, device="meta").parameters())
    params = estimate_memory(cfg, 1).params
    assert params.model_total == built
    assert params.dense + params.expert == built


@pytest.mark.parametrize("layout", [{}, {"tensor_model_parallel_size": 2}, {"pipeline_model_parallel_size": 2}])
def test_ddp_shards_the_optimizer_state_only_without_tp_and_pp(layout: dict[str, int]) -> None:
    """The DDP backend shards the optimizer state (ZeRO-1) only without TP and PP (distributed/ddp.py's
    prepare_optimizer): at DP 2 the distributed optimizer halves it at TP = PP = 1, and changes nothing with TP or PP
    2 (the estimate says why)."""
    def estimate(distributed: bool) -> tuple[int, list[str]]:
        cfg = tiny_llama_pretrain_config(**layout)
        cfg.optimizer.use_distributed_optimizer = cfg.ddp.use_distributed_optimizer = distributed
        world_size = 2 * max(layout.values(), default=1)
        est = estimate_memory(cfg.validate(world_size=world_size), world_size)
        return est.optimizer_bytes, est.notes

    (plain, _), (distributed, notes) = estimate(False), estimate(True)
    if layout:
        assert distributed == plain and any("stays replicated" in n for n in notes), notes
    else:
        assert distributed * 2 == plain and any("ZeRO-1" in n for n in notes), notes
