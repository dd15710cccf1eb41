"""Export a quantization-aware-trained checkpoint as modelopt documents it for a PyTorch model: ``mto.save``.

The output file holds the modelopt state and the state dict (weights and calibrated quantizer buffers); a consumer
rebuilds the architecture and calls ``modelopt.torch.opt.restore(model, path)`` to get the quantized model back
(:func:`restore_exported`). modelopt's Hugging Face unified export (``modelopt.torch.export.export_hf_checkpoint``,
for TensorRT-LLM / vLLM) needs a ``transformers`` model, i.e. the Bridge's HF conversion; the plain weights of a QAT
checkpoint also convert to an HF folder with ``scripts/checkpoint/convert.py``.
"""

from pathlib import Path

import torch
from torch import nn

from megatron_bridge.config.container import ConfigContainer
from megatron_bridge.config.model import ModelConfig
from megatron_bridge.errors import CheckpointError


def load_quantized_model(checkpoint: str | Path, step: int | None = None) -> tuple[nn.Module, ModelConfig]:
    """The quantized model of a checkpoint (root or ``iter_*`` folder), built on CPU in this process."""
    from megatron_bridge.checkpoint import load as loading
    from megatron_bridge.checkpoint.files import RUN_CONFIG_FILENAME
    from megatron_bridge.models.llama import LlamaModel
    from megatron_bridge.optimization.state import read_modelopt_state, restore_modelopt_state
    from megatron_bridge.optimization.weights import load_weights_into

    folder = loading.resolve_folder(Path(checkpoint), step)
    if folder is None:
        raise CheckpointError(f"{str(checkpoint)!r} holds no checkpoint")
    source = loading.inspect_folder(folder, weights_only=True)
    content = read_modelopt_state(folder)
    if content is None:
        raise CheckpointError(f"{str(folder)!r} has no modelopt_state.pt: it was not trained with quantization")
    model_cfg = ConfigContainer.from_yaml(folder / RUN_CONFIG_FILENAME).model
    model_cfg.init_model_with_meta_device = False
    model = restore_modelopt_state(LlamaModel(model_cfg, device="cpu"), content, str(folder))
    load_weights_into(model, source)
    return model.eval(), model_cfg


def export_modelopt(checkpoint: str | Path, output: str | Path, step: int | None = None) -> Path:
    """Write ``mto.save`` of the checkpoint's quantized model to ``output``; returns the path."""
    import modelopt.torch.opt as mto

    model, _ = load_quantized_model(checkpoint, step)
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = output.with_name(output.name + ".tmp")
    mto.save(model, tmp)
    tmp.replace(output)
    return output


def restore_exported(model_cfg: ModelConfig, path: str | Path) -> nn.Module:
    """Rebuild the model of ``model_cfg`` and restore an :func:`export_modelopt` file into it (``mto.restore``).

    The file is a trusted artefact you exported: ``mto.restore`` unpickles it (modelopt's own loader)."""
    import modelopt.torch.opt as mto

    from megatron_bridge.models.llama import LlamaModel

    with torch.device("cpu"):
        model = LlamaModel(model_cfg, device="cpu")
    return mto.restore(model, str(path)).eval()
