"""Tensor parallelism on 2 gloo ranks (dp=1 × tp=2, FSDP2 or DDP over the 1-rank dp dimension) trains like one
process.

* ``test_tp_fsdp2_matches_reference``: through ``ddp_wrap``, 3 SGD steps with gradient clipping on the same global
  batch, with and without sequence parallelism, a custom ``fsdp2.tp_plan``, a meta-device build with per-head q/k
  norms and two micro-batches, and tied embeddings (the vocabulary-parallel embedding weight also produces the
  logits, so its gradient sums both uses; with and without sequence parallelism, the latter built on the meta
  device); and the DDP backend (torch's FSDP-based ``replicate``) with tied embeddings, sequence parallelism and two
  micro-batches. Tolerances (fp32): losses rtol 1e-5, gradient norms rtol 1e-5, parameters atol 1e-5 after gathering the
  full tensors (observed ≤ 2e-7: only the summation order differs).
* ``test_tp_pretrain_matches_reference``: ``pretrain`` with ``tiny_llama_pretrain_config(tensor_model_parallel_size=2,
  use_torch_fsdp2=True, sequence_parallel=True)`` against a single-process run: losses rtol 1e-5, weights atol 2e-5
  (8 AdamW steps, as tests/functional_tests/training/test_pretrain_backends.py); then the same under DDP.

Both runs pad the vocabulary to the same size (``padded_vocab_size`` depends on TP: the reference uses twice the
``make_vocab_size_divisible_by``). Both tests share one torchrun launch and process group (launcher.py's
``LaunchGroups``; each stays a test of its own).
"""

from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from megatron_bridge.config.container import ConfigContainer
from megatron_bridge.distributed.init import initialize_distributed
from megatron_bridge.distributed.tensor_parallel import TiedOutput
from megatron_bridge.engines.ddp_wrap import ddp_wrap
from megatron_bridge.models import build_model_chunks
from megatron_bridge.training.pretrain import pretrain
from tests.functional_tests.distributed.helpers import global_batches, tiny_cfg
from tests.functional_tests.launcher import LaunchGroups, is_worker, selected_groups
from tests.functional_tests.training._common import (
    FullWeights,
    assert_finite_decreasing,
    assert_matches_reference,
    max_weight_diff,
    run_reference,
    small_config,
)


pytestmark = [pytest.mark.distributed, pytest.mark.timeout(600)]

LR, CLIP = 0.5, 1.0
LOSS_RTOL, NORM_RTOL, PARAM_ATOL = 1e-5, 1e-5, 1e-5
PRETRAIN_WEIGHT_ATOL = 2e-5
GROUPS = {2: ["test_tp_fsdp2_matches_reference", "test_tp_pretrain_matches_reference"]}
"""One launch runs both tests."""
VOCAB_DIVISOR = 64
"""make_vocab_size_divisible_by of the TP runs: vocab 100 pads to 128 with TP=2, as with 2×64 at TP=1."""

CUSTOM_PLAN = {
    "*norm": "sequence_parallel",
    "embed_tokens": "rowwise",
    "layers.*.self_attn.[qkv]_proj": "colwise",
    "layers.*.*.o_proj": "rowwise",
    "layers.*.mlp.down_proj": "rowwise",
    "layers.*.mlp.*_proj": "colwise",
    "lm_head": "colwise",
}


@dataclass
class Case:
    """One TP configuration compared with the single-process reference."""

    name: str
    model: dict[str, object] = field(default_factory=dict)
    tp_plan: dict[str, str] | None = None
    microbatches: int = 1
    fsdp2: bool = True
    """False: the DDP backend (torch's FSDP-based ``replicate`` over the DTensor parameters)."""


CASES = [
    Case("auto plan"),
    Case("auto plan, sequence parallel", {"sequence_parallel": True}),
    Case("custom plan, sequence parallel", {"sequence_parallel": True}, CUSTOM_PLAN),
    Case("meta build, q/k norms, GELU + biases, 2 micro-batches",
         {"init_model_with_meta_device": True, "qk_layernorm": True, "activation": "gelu", "add_bias_linear": True,
          "add_qkv_bias": True}, microbatches=2),
    # The embedding weight serves as the column-wise output layer too: its gradient holds both uses.
    Case("tied embeddings, auto plan", {"share_embeddings_and_output_weights": True}),
    Case("tied embeddings, sequence parallel, meta build",
         {"share_embeddings_and_output_weights": True, "sequence_parallel": True, "init_model_with_meta_device": True}),
    Case("DDP: tied embeddings, sequence parallel, 2 micro-batches",
         {"share_embeddings_and_output_weights": True, "sequence_parallel": True}, microbatches=2, fsdp2=False),
]

ARCHITECTURE = ("qk_layernorm", "activation", "add_bias_linear", "add_qkv_bias",
                "share_embeddings_and_output_weights")


def _cfg(tp: int, case: Case) -> ConfigContainer:
    options = case.model if tp > 1 else {k: v for k, v in case.model.items() if k in ARCHITECTURE}
    cfg = tiny_cfg(fsdp2=tp > 1 and case.fsdp2, tensor_model_parallel_size=tp,
                   make_vocab_size_divisible_by=VOCAB_DIVISOR * 2 // tp, **options)
    cfg.fsdp2.tp_plan = case.tp_plan
    return cfg


def _train(case: Case, tp: int) -> tuple[list[float], list[float], dict[str, torch.Tensor]]:
    """Losses, gradient norms and full parameters after the steps; tp=1 is the plain reference model."""
    cfg = _cfg(tp, case)
    torch.manual_seed(0)
    chunks = build_model_chunks(cfg.model, device="cpu")
    backend = ddp_wrap(chunks, cfg, torch.device("cpu")) if tp > 1 else None
    model = backend.chunks[0] if backend else chunks[0]
    params = backend.parameters() if backend else list(model.parameters())
    opt = torch.optim.SGD(params, lr=LR)
    losses, norms = [], []
    for ids in global_batches():  # every rank of the TP group reads the whole global batch
        loss = 0.0
        for part in ids.chunk(case.microbatches):
            micro = model(part, labels=part).mean() / case.microbatches
            micro.backward()
            loss += micro.item()
        if backend:
            norm = backend.clip_grad_norm(CLIP)
        else:
            norm = torch.nn.utils.clip_grad_norm_(params, CLIP)
        losses.append(loss)
        norms.append(float(norm))
        opt.step()
        opt.zero_grad(set_to_none=True)
    state = backend.model_state_dict()["model"] if backend else model.state_dict()
    full = {k: (v.full_tensor() if isinstance(v, DTensor) else v).detach().clone() for k, v in state.items()}
    if backend:
        _check_layout(backend, cfg)
    return losses, norms, full


def _check_layout(backend, cfg: ConfigContainer) -> None:  # noqa: ANN001
    if backend.name == "fsdp2":
        assert backend.mesh.size() == 1 and backend.tp_mesh.size() == 2
    else:
        assert backend.name == "ddp" and backend.replicated
    model = backend.chunks[0]
    weight = model.layers[0].self_attn.q_proj.weight
    assert isinstance(weight, DTensor) and weight.device_mesh.mesh_dim_names == ("dp", "tp")
    m = cfg.model
    assert weight.to_local().shape[0] == m.num_attention_heads * m.head_dim // 2
    attn = model.layers[0].self_attn
    assert (attn.num_heads, attn.num_kv_heads) == (m.num_attention_heads // 2, m.num_kv_heads // 2)
    if m.share_embeddings_and_output_weights:  # one vocab-sharded weight, read by the parameter-free output layer
        assert isinstance(model.lm_head, TiedOutput) and not list(model.lm_head.parameters())
        assert model.lm_head.weight is model.embed_tokens.weight
        assert model.embed_tokens.weight.to_local().shape[0] == m.padded_vocab_size // 2


def _compare(case: Case) -> str | None:
    ref_losses, ref_norms, ref_state = _train(case, tp=1)
    losses, norms, state = _train(case, tp=2)
    if state.keys() != ref_state.keys():
        return f"{case.name}: state-dict keys differ: {sorted(state.keys() ^ ref_state.keys())}"
    shapes = [k for k in state if state[k].shape != ref_state[k].shape]
    if shapes:
        return f"{case.name}: shapes differ for {shapes}"
    for what, got, want, rtol in (("loss", losses, ref_losses, LOSS_RTOL), ("grad norm", norms, ref_norms, NORM_RTOL)):
        for step, (g, w) in enumerate(zip(got, want, strict=True)):
            if abs(g - w) > rtol * abs(w):
                return f"{case.name}: {what} at step {step} is {g} vs reference {w}"
    diff = max_weight_diff(state, ref_state)
    if diff > PARAM_ATOL:
        return f"{case.name}: max |param - reference| = {diff:.3g} (atol {PARAM_ATOL})"
    if dist.get_rank() == 0:
        print(f"[tp parity] {case.name}: max param diff {diff:.2e}, losses {losses}")
    return None


def _join_group() -> None:
    """The launch's process group, made here (so pretrain() and initialize_distributed reuse it, leaving it alive)."""
    if not dist.is_initialized():
        dist.init_process_group("gloo")


@pytest.fixture(scope="module")
def launches(pretrain_reference: Path | None, request: pytest.FixtureRequest) -> LaunchGroups | None:
    """The module's launch (launching process only), running the tests this session selected."""
    if is_worker():
        return None
    return LaunchGroups(__file__, selected_groups(request, GROUPS), {2: 600},
                        env={"MB_REFERENCE": str(pretrain_reference)})


def test_tp_fsdp2_matches_reference(launches: LaunchGroups | None) -> None:
    if not is_worker():
        launches.check("test_tp_fsdp2_matches_reference")  # type: ignore[union-attr]
        return
    _join_group()
    env = initialize_distributed(tiny_cfg())
    assert env.world_size == 2
    failures = [message for case in CASES if (message := _compare(case))]
    assert not failures, "\n".join(failures)


# ------------------------------------------------------------------------------------------------ pretrain
def _pretrain_config(tp: int) -> ConfigContainer:
    cfg = small_config(tensor_model_parallel_size=tp, use_torch_fsdp2=tp > 1, sequence_parallel=tp > 1)
    cfg.model.make_vocab_size_divisible_by = 256 // tp  # the same padded vocabulary at TP=1 and TP=2
    return cfg


@pytest.fixture(scope="module")
def pretrain_reference(tmp_path_factory: pytest.TempPathFactory) -> Path | None:
    """Single-process pretrain run (in the launching process only)."""
    if is_worker():
        return None
    return run_reference(_pretrain_config(1), tmp_path_factory.mktemp("tp_reference"))


@pytest.mark.support_cells("llama:tp")
def test_tp_pretrain_matches_reference(launches: LaunchGroups | None) -> None:
    if not is_worker():
        launches.check("test_tp_pretrain_matches_reference")  # type: ignore[union-attr]
        return
    _join_group()
    cfg = _pretrain_config(2)
    assert cfg.model.padded_vocab_size == _pretrain_config(1).model.padded_vocab_size
    weights = FullWeights()
    result = pretrain(cfg, callbacks=[weights])
    assert result.backend == "fsdp2" and result.final_step == 8
    assert_finite_decreasing(result.losses)
    assert_matches_reference(result, weights.weights, loss_rtol=LOSS_RTOL, weight_atol=PRETRAIN_WEIGHT_ATOL,
                             label="pretrain TP=2 + SP")
    cfg = _pretrain_config(2)
    cfg.dist.use_torch_fsdp2 = False  # the DDP backend: replicate over the DTensor parameters
    weights = FullWeights()
    result = pretrain(cfg, callbacks=[weights])
    assert result.backend == "ddp" and result.final_step == 8
    assert_matches_reference(result, weights.weights, loss_rtol=LOSS_RTOL, weight_atol=PRETRAIN_WEIGHT_ATOL,
                             label="pretrain TP=2 + SP, DDP")
