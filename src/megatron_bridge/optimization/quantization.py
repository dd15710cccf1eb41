"""Quantization-aware training with ``modelopt.torch.quantization`` (``cfg.quantization``).

:func:`prepare_quantized_model` runs in ``pretrain``'s set-up on the plain model, before ``ddp_wrap``:

* resuming from a checkpoint that carries a modelopt state (ours, or a quantized ``pretrained_checkpoint``):
  the quantizers are re-created from it and their calibrated buffers loaded — no calibration, resume is exact;
* otherwise: the starting weights (``checkpoint.pretrained_checkpoint`` when set) are loaded, then
  ``mtq.quantize(model, config, forward_loop)`` inserts fake-quant quantizers and calibrates them on the first
  ``quantization.calib_size`` training samples (the same samples on every rank, so every rank gets the same scales).

Training then runs through the fake-quant modules (straight-through estimator gradients); the optimizer sees the
same parameters as without quantization (the quantizers add buffers only).
"""

import copy
from typing import Any

import torch
from torch import nn

from megatron_bridge.config.container import ConfigContainer
from megatron_bridge.config.model_optimization import QuantizationConfig
from megatron_bridge.utils.logging import get_logger, log_rank_0


logger = get_logger(__name__)

MODELOPT_CONFIGS: dict[str, str] = {
    "int8": "INT8_DEFAULT_CFG",
    "int8_sq": "INT8_SMOOTHQUANT_CFG",
    "fp8": "FP8_DEFAULT_CFG",
    "int4_awq": "INT4_AWQ_CFG",
    "w4a8_awq": "W4A8_AWQ_BETA_CFG",
    "nvfp4": "NVFP4_DEFAULT_CFG",
    "mxfp8": "MXFP8_DEFAULT_CFG",
}
"""``quantization.quant_cfg`` → the ``modelopt.torch.quantization`` config constant it selects."""


def modelopt_quant_config(qcfg: QuantizationConfig) -> dict[str, Any]:
    """A private copy of the modelopt config of ``qcfg.quant_cfg`` (input quantizers off with ``weight_only``)."""
    import modelopt.torch.quantization as mtq

    config = copy.deepcopy(getattr(mtq, MODELOPT_CONFIGS[str(qcfg.quant_cfg)]))
    if qcfg.weight_only:
        config["quant_cfg"].append({"quantizer_name": "*input_quantizer", "enable": False})
    return config


def calibration_batches(cfg: ConfigContainer, tokenizer: Any) -> list[dict[str, torch.Tensor]]:
    """The first ``quantization.calib_size`` training samples in micro-batches (identical on every rank)."""
    from torch.utils.data import default_collate

    from megatron_bridge.data.loaders import build_pretraining_datasets

    n = cfg.quantization.calib_size
    dataset = build_pretraining_datasets(cfg.dataset, tokenizer, (n, 0, 0))[0]
    samples = [dataset[i] for i in range(min(n, len(dataset)))]
    mbs = cfg.train.micro_batch_size
    return [default_collate(samples[i : i + mbs]) for i in range(0, len(samples), mbs)]


def calibrate_and_quantize(model: nn.Module, qcfg: QuantizationConfig, batches: list[dict[str, torch.Tensor]],
                           device: torch.device) -> nn.Module:
    """Insert the quantizers of ``qcfg`` into ``model`` and calibrate them on ``batches`` (no gradients)."""
    import modelopt.torch.quantization as mtq

    def forward_loop(m: nn.Module) -> None:
        with torch.no_grad():
            for batch in batches:
                m(batch["tokens"].to(device), position_ids=batch["position_ids"].to(device))

    was_training = model.training
    model.eval()
    model = mtq.quantize(model, modelopt_quant_config(qcfg), forward_loop)
    model.train(was_training)
    return model


def disable_quantizers(model: nn.Module) -> None:
    """Disable every quantizer of ``model``: it computes as unquantized (up to the scales SmoothQuant and AWQ fold
    into the weights). Not reversible by ``mtq.enable_quantizer("*")``, which would also enable the quantizers the
    format leaves off (the output layer, outputs)."""
    import modelopt.torch.quantization as mtq

    mtq.disable_quantizer(model, "*")


def prepare_quantized_model(cfg: ConfigContainer, model: nn.Module, tokenizer: Any,
                            device: torch.device) -> nn.Module:
    """Quantize the plain ``model`` for QAT (restored from the checkpoint to resume, else calibrated)."""
    from megatron_bridge.optimization.state import restore_modelopt_state
    from megatron_bridge.optimization.weights import load_start_weights, modelopt_state_to_resume

    qcfg = cfg.quantization
    found = modelopt_state_to_resume(cfg)
    if found is not None:
        folder, content = found
        model = restore_modelopt_state(model, content, folder)
        log_rank_0(logger, "quantization: restored the %s quantizers from %s", qcfg.quant_cfg, folder)
    else:
        load_start_weights(cfg, model)
        batches = calibration_batches(cfg, tokenizer)
        model = calibrate_and_quantize(model, qcfg, batches, device)
        log_rank_0(logger, "quantization: inserted %s fake-quant and calibrated it on %d samples", qcfg.quant_cfg,
                   sum(len(b["tokens"]) for b in batches))
    if qcfg.disable_quantizers:
        disable_quantizers(model)
        log_rank_0(logger, "quantization: quantization.disable_quantizers=True: every quantizer is disabled")
    return model
