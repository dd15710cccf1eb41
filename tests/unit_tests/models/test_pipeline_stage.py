"""Pipeline stage modules: pruned copies with the full model's names and weights, forward chained = full forward,
and the large recipes' layouts (shrunk in width and depth) build on every pipeline rank."""

import pytest
import torch

from megatron_bridge.config.model import ModelConfig
from megatron_bridge.config.pipeline_layout import stage_layer_counts
from megatron_bridge.models import build_model_chunks
from megatron_bridge.recipes import RECIPES


def _tiny(**fields: object) -> ModelConfig:
    base: dict[str, object] = {"num_layers": 4, "hidden_size": 32, "ffn_hidden_size": 64, "num_attention_heads": 4,
                               "num_query_groups": 2, "vocab_size": 100, "make_vocab_size_divisible_by": 16,
                               "seq_length": 16}
    return ModelConfig(**{**base, **fields})  # type: ignore[arg-type]


def _chunks(cfg: ModelConfig, pp_rank: int, seed: int = 0) -> list[torch.nn.Module]:
    torch.manual_seed(seed)
    return build_model_chunks(cfg, device="cpu", pp_rank=pp_rank)


def test_stages_keep_full_names_and_weights_and_chain_to_the_full_forward() -> None:
    cfg = _tiny(pipeline_model_parallel_size=2, virtual_pipeline_model_parallel_size=2)
    full = _chunks(_tiny(), 0)[0]
    ref = full.state_dict()
    rank0, rank1 = _chunks(cfg, 0), _chunks(cfg, 1)
    stages = [rank0[0], rank1[0], rank0[1], rank1[1]]  # stage order: s on rank s % 2
    names = [k for s in stages for k in s.state_dict()]
    assert sorted(names) == sorted(ref) and len(names) == len(set(names))
    for stage in stages:
        for k, v in stage.state_dict().items():
            assert torch.equal(v, ref[k]), k
    assert "embed_tokens.weight" in stages[0].state_dict() and "lm_head.weight" in stages[3].state_dict()
    assert list(stages[1].state_dict())[0].startswith("layers.1.")
    ids = torch.randint(0, 100, (2, 16), generator=torch.Generator().manual_seed(1))
    hidden = ids
    for stage in stages:
        hidden = stage(hidden)
    assert torch.equal(hidden, full(ids))


def test_tied_last_stage_keeps_its_own_copy_of_the_embedding() -> None:
    """Tied at PP=2 × VP=2: the last stage holds ``embed_tokens.weight`` (the PP=1 key) as a parameter of its own with
    the first stage's values, takes hidden states as input, and the chained stages give the full forward."""
    cfg = _tiny(pipeline_model_parallel_size=2, virtual_pipeline_model_parallel_size=2,
                share_embeddings_and_output_weights=True)
    full = _chunks(_tiny(share_embeddings_and_output_weights=True), 0)[0]
    rank0, rank1 = _chunks(cfg, 0), _chunks(cfg, 1)
    stages = [rank0[0], rank1[0], rank0[1], rank1[1]]
    first, last = stages[0].embed_tokens, stages[3].embed_tokens
    assert last is not None and last.weight is not first.weight and torch.equal(last.weight, first.weight)
    assert [s.embed_tokens is not None for s in stages] == [True, False, False, True]
    assert [s.embeds_input for s in stages] == [True, False, False, False]
    assert sorted({k for s in stages for k in s.state_dict()}) == sorted(full.state_dict())
    ids = torch.randint(0, 100, (2, 16), generator=torch.Generator().manual_seed(1))
    hidden = ids
    for stage in stages:
        hidden = stage(hidden)
    assert torch.equal(hidden, full(ids))


def test_pipeline_dtype_casts_stage_outputs() -> None:
    cfg = _tiny(pipeline_model_parallel_size=2, pipeline_dtype="bfloat16")
    first = _chunks(cfg, 0)[0]
    assert first(torch.zeros(1, 16, dtype=torch.long)).dtype == torch.bfloat16
    assert _chunks(cfg, 1)[0](torch.zeros(1, 16, 32)).dtype == torch.float32  # the last stage returns logits


def test_meta_device_stages_hold_only_their_modules() -> None:
    cfg = _tiny(pipeline_model_parallel_size=2, init_model_with_meta_device=True)
    stage = _chunks(cfg, 1)[0]
    assert all(p.is_meta for p in stage.parameters())
    assert stage.embed_tokens is None and sorted(stage.layers.keys()) == ["2", "3"]


def _shrunk(cfg_fn, num_layers: int):  # noqa: ANN001, ANN202  (recipe function -> ConfigContainer)
    """The recipe with its whole parallel layout (TP, PP, VP, CP, SP, the pipeline split) and a tiny model."""
    cfg = cfg_fn()
    m = cfg.model
    m.num_layers, m.hidden_size, m.ffn_hidden_size, m.num_attention_heads = num_layers, 64, 64, 8
    m.num_query_groups, m.vocab_size, m.make_vocab_size_divisible_by = 8, 100, 16
    m.seq_length = cfg.dataset.seq_length = 2 * m.context_parallel_size * m.tensor_model_parallel_size
    cfg.tokenizer.vocab_size = 100
    return cfg


@pytest.mark.parametrize(("name", "layers"), [("llama3_70b", 20), ("llama31_70b", 20), ("llama31_405b", 14)])
def test_large_recipe_layouts_validate_and_build_on_every_pipeline_rank(name: str, layers: int) -> None:
    """llama3_70b / llama31_70b (TP4 PP4 VP5 CP2 SP) and llama31_405b (TP8 PP8 VP2 CP4 SP, embedding and loss
    counted in the split: first and last stages one layer fewer), shrunk in width and depth, validate at the
    recipe's world size and build every pipeline rank's chunks."""
    info = RECIPES[name]
    cfg = _shrunk(info.fn, layers)
    m = cfg.model
    assert m.context_parallel_size > 1 and m.tensor_model_parallel_size > 1 and m.sequence_parallel
    cfg.validate(world_size=info.world_size)
    counts = stage_layer_counts(m)
    if m.account_for_embedding_in_pipeline_split:
        assert counts[0] == counts[-1] == counts[1] - 1
    built = []
    for pp_rank in range(m.pipeline_model_parallel_size):
        chunks = _chunks(m, pp_rank)
        assert len(chunks) == m.virtual_pipeline_model_parallel_size
        built += [len(c.layers) for c in chunks]
    assert sorted(built) == sorted(counts) and sum(built) == layers
