"""Per-layer RoPE (models/layers.py): the window layers' own base (``model.rotary_base_local``) and the global
layers' linear scaling (``model.seq_len_interpolation_factor``), against transformers' Gemma 3 RoPE, which keeps one
RoPE per layer type; and which layers of the shared decoder take which."""

import pytest
import torch

from megatron_bridge.config.model import ModelConfig
from megatron_bridge.models.layers import RotaryEmbedding
from megatron_bridge.models.llama import LlamaModel


def _config(**extra: object) -> ModelConfig:
    fields: dict = {"rotary_base_local": 10_000.0, **extra}
    return ModelConfig(num_layers=6, hidden_size=64, num_attention_heads=4, kv_channels=16, window_size=(7, 0),
                       window_attn_skip_freq=3, rotary_base=1_000_000.0, **fields)


@pytest.mark.parametrize("factor", [None, 8.0])
def test_local_and_global_rope_equal_transformers_gemma3(factor: float | None) -> None:
    from transformers import Gemma3TextConfig
    from transformers.models.gemma3.modeling_gemma3 import Gemma3RotaryEmbedding

    full = {"rope_type": "default", "rope_theta": 1_000_000.0} if factor is None else \
        {"rope_type": "linear", "factor": factor, "rope_theta": 1_000_000.0}
    hf = Gemma3RotaryEmbedding(Gemma3TextConfig(
        hidden_size=64, num_attention_heads=4, head_dim=16, num_hidden_layers=6, sliding_window=8,
        rope_parameters={"full_attention": full, "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}))
    ours = RotaryEmbedding(_config(seq_len_interpolation_factor=factor))
    pos = torch.arange(300).unsqueeze(0)
    x = torch.zeros(1, dtype=torch.float32)
    for local, layer_type in ((False, "full_attention"), (True, "sliding_attention")):
        cos, sin = ours(pos, local=local)
        want_cos, want_sin = hf(x, pos, layer_type)
        torch.testing.assert_close(cos[:, 0], want_cos, atol=2e-6, rtol=0)
        torch.testing.assert_close(sin[:, 0], want_sin, atol=2e-6, rtol=0)


def test_window_layers_take_the_local_rope() -> None:
    """window_attn_skip_freq=3: layers 3 and 6 (1-based) are full attention with the global RoPE, the others have
    the window and the local RoPE; without rotary_base_local every layer takes the global one."""
    model = LlamaModel(_config(), device="meta")
    assert [layer.uses_local_rope for layer in model.layers] == [True, True, False, True, True, False]
    assert [layer.self_attn.window for layer in model.layers] == [8, 8, None, 8, 8, None]
    plain = LlamaModel(_config(rotary_base_local=None), device="meta")
    assert not any(layer.uses_local_rope for layer in plain.layers)


def test_local_rope_changes_only_the_window_layers() -> None:
    """The same weights with another local base: the logits change; with a local base equal to the global one they
    do not (the window layers then rotate exactly as before)."""
    torch.manual_seed(0)
    same = LlamaModel(_config(rotary_base_local=1_000_000.0))
    tokens = torch.randint(0, 256, (1, 20))
    other = LlamaModel(_config(), device="meta")
    other.to_empty(device="cpu")
    other.load_state_dict(same.state_dict())
    other.rotary_emb.reset_parameters()
    plain = LlamaModel(_config(rotary_base_local=None), device="meta")
    plain.to_empty(device="cpu")
    plain.load_state_dict(same.state_dict())
    plain.rotary_emb.reset_parameters()
    with torch.no_grad():
        assert torch.equal(same(tokens), plain(tokens))
        assert (same(tokens) - other(tokens)).abs().max() > 1e-4
