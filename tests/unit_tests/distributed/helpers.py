"""Small configs, models and batches shared by the distributed unit tests."""

import torch
from torch import nn

from megatron_bridge.config.container import ConfigContainer
from megatron_bridge.config.model import ModelConfig
from megatron_bridge.models import build_model_chunks


VOCAB = 100
SEQ = 16


def tiny_cfg(*, fsdp2: bool = False, num_layers: int = 3, **model: object) -> ConfigContainer:
    """A config of a ~40k-parameter Llama that builds and steps in milliseconds."""
    base: dict[str, object] = {
        "num_layers": num_layers, "hidden_size": 32, "ffn_hidden_size": 64, "num_attention_heads": 4,
        "num_query_groups": 2, "vocab_size": VOCAB, "make_vocab_size_divisible_by": 16, "seq_length": SEQ,
    }
    base.update(model)
    cfg = ConfigContainer(model=ModelConfig(**base))  # type: ignore[arg-type]
    cfg.dist.use_torch_fsdp2 = fsdp2
    cfg.dist.distributed_backend = "gloo"  # CPU tests, also on a machine with CUDA
    return cfg


def build(cfg: ConfigContainer, seed: int = 0) -> list[nn.Module]:
    """The model chunks of ``cfg`` built on CPU with ``seed``."""
    torch.manual_seed(seed)
    return build_model_chunks(cfg.model, device="cpu")


def batch(rows: int = 2, seed: int = 1) -> torch.Tensor:
    """Token ids ``[rows, SEQ]``."""
    return torch.randint(0, VOCAB, (rows, SEQ), generator=torch.Generator().manual_seed(seed))


def full_state(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A state dict with DTensors gathered to full tensors."""
    return {k: (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().clone() for k, v in state.items()}


def count_modules(model: nn.Module, cls: type) -> int:
    """How many submodules of ``model`` are instances of ``cls``."""
    return sum(isinstance(m, cls) for m in model.modules())
