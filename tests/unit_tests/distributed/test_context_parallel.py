"""The zig-zag layout, per-rank batch slicing, the load balance of the attention work and the CP wiring errors."""

import pytest
import torch

from megatron_bridge.config.container import ConfigContainer
from megatron_bridge.config.data import DatasetConfig, TokenizerConfig
from megatron_bridge.data.loaders import build_pretraining_data_loaders
from megatron_bridge.data.tokenizers import build_tokenizer
from megatron_bridge.data.zigzag import (
    attention_work,
    gathered_positions,
    slice_batch_for_context_parallel,
    zigzag_chunk_ids,
    zigzag_positions,
)
from megatron_bridge.distributed.context_parallel import apply_context_parallel, context_parallel_rank
from megatron_bridge.distributed.init import data_parallel_rank
from megatron_bridge.errors import ConfigValidationError

from .helpers import build, tiny_cfg


def test_zigzag_chunks_and_positions() -> None:
    assert [zigzag_chunk_ids(4, r) for r in range(4)] == [(0, 7), (1, 6), (2, 5), (3, 4)]
    assert zigzag_positions(8, 2, 0).tolist() == [0, 1, 6, 7]
    assert zigzag_positions(8, 2, 1).tolist() == [2, 3, 4, 5]
    for cp in (1, 2, 4):  # the ranks' slices cover the sequence once
        assert sorted(gathered_positions(32, cp).tolist()) == list(range(32))
    with pytest.raises(ConfigValidationError, match="not divisible by 2×model.context_parallel_size = 8"):
        zigzag_positions(12, 4, 0)


@pytest.mark.parametrize("cp", [2, 4, 8])
def test_zigzag_equalises_causal_work(cp: int) -> None:
    """Every CP rank evaluates the same number of score entries (and keeps the same number under the causal mask);
    the contiguous split does not balance."""
    seq = 64 * cp
    zigzag = [attention_work(seq, cp, r) for r in range(cp)]
    assert len(set(zigzag)) == 1, zigzag
    contiguous = [attention_work(seq, cp, r, layout="contiguous") for r in range(cp)]
    assert len(set(contiguous)) == cp  # every rank differs: the last does the most
    # all ranks together keep exactly the causal triangle
    assert sum(c for _, c in zigzag) == seq * (seq + 1) // 2 == sum(c for _, c in contiguous)


def test_work_numbers_at_cp4_seq64() -> None:
    """The numbers measured in engine-feasibility.md: 520 causal entries per rank vs 136…904 contiguous; the
    prefix calls evaluate C²(2P+1) = 8²·9 entries per rank."""
    assert [attention_work(64, 4, r) for r in range(4)] == [(576, 520)] * 4
    assert [attention_work(64, 4, r, layout="contiguous")[1] for r in range(4)] == [136, 392, 648, 904]


def test_slice_batch_keeps_absolute_positions() -> None:
    tokens = torch.arange(2 * 8).view(2, 8)
    batch = {"tokens": tokens, "labels": tokens + 1, "loss_mask": torch.ones(2, 8)}
    part = slice_batch_for_context_parallel(batch, 2, 1)
    assert part["tokens"].tolist() == [[2, 3, 4, 5], [10, 11, 12, 13]]
    assert part["position_ids"].tolist() == [[2, 3, 4, 5]] * 2
    assert part["labels"].tolist() == [[3, 4, 5, 6], [11, 12, 13, 14]] and part["loss_mask"].shape == (2, 4)
    assert slice_batch_for_context_parallel(batch, 1, 0) is batch


def test_loader_gives_each_cp_rank_its_slice_of_the_same_samples() -> None:
    tok = build_tokenizer(TokenizerConfig(tokenizer_type="byte"))
    cfg = DatasetConfig(mock=True, seq_length=16, reset_position_ids=True)

    def batches(cp: int, rank: int) -> list[dict[str, torch.Tensor]]:
        return list(build_pretraining_data_loaders(cfg, tok, micro_batch_size=2, train_samples=8, valid_samples=0,
                                                   test_samples=0, data_parallel_rank=0, data_parallel_size=1,
                                                   context_parallel_size=cp, context_parallel_rank=rank).train)

    full, parts = batches(1, 0), [batches(4, r) for r in range(4)]
    order = torch.argsort(gathered_positions(16, 4))
    for i, whole in enumerate(full):
        for key, value in whole.items():
            joined = torch.cat([p[i][key] for p in parts], dim=1)[:, order]
            assert torch.equal(joined, value), key
    assert parts[0][0]["tokens"].shape == (2, 4)


def test_ranks_in_the_dp_cp_tp_mesh() -> None:
    cfg = ConfigContainer()
    cfg.model.context_parallel_size, cfg.model.tensor_model_parallel_size = 2, 2
    # rank = (dp * cp + cp_rank) * tp + tp_rank on 8 ranks: dp 2 × cp 2 × tp 2
    assert [data_parallel_rank(cfg, r, 8) for r in range(8)] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert [context_parallel_rank(cfg, r) for r in range(8)] == [0, 0, 1, 1, 0, 0, 1, 1]


def test_apply_context_parallel_errors(process_group) -> None:  # noqa: ANN001
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (1,), mesh_dim_names=("cp",))
    cfg = tiny_cfg(context_parallel_size=2)
    model = build(cfg)[0]
    with pytest.raises(ConfigValidationError, match="the CP mesh has 1 ranks"):
        apply_context_parallel(model, mesh, cfg)
    assert apply_context_parallel(model, mesh, tiny_cfg()) == cfg.model.num_layers
    assert model.cp_layout == (1, 0) and model.layers[0].self_attn.context_parallel is not None
    with pytest.raises(ConfigValidationError, match="no attention modules"):
        apply_context_parallel(torch.nn.Linear(2, 2), mesh, tiny_cfg())
