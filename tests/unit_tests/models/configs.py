"""The small model config the model tests share."""

from megatron_bridge.config.model import ModelConfig


def tiny(**overrides: object) -> ModelConfig:
    """A config that builds and runs in milliseconds (2 layers, hidden 32, 4 heads / 2 KV groups, vocab 100)."""
    base: dict[str, object] = {
        "num_layers": 2,
        "hidden_size": 32,
        "ffn_hidden_size": 64,
        "num_attention_heads": 4,
        "num_query_groups": 2,
        "vocab_size": 100,
        "make_vocab_size_divisible_by": 16,
        "seq_length": 16,
    }
    base.update(overrides)
    return ModelConfig(**base)  # type: ignore[arg-type]
