"""Validation rules of nvidia-modelopt quantization-aware training and knowledge distillation
(``cfg.quantization``, ``cfg.distillation``; docs/training/model-optimization.md).

Package and CUDA probes run only when a section is switched on, so other configs never import torch or modelopt.
"""

from typing import TYPE_CHECKING

from megatron_bridge.config.model_optimization import CPU_QUANT_FORMATS
from megatron_bridge.config.rule_registry import fail, rule


if TYPE_CHECKING:
    from megatron_bridge.config.container import ConfigContainer

MODELOPT_INSTALL = "pip install 'megatron-bridge[modelopt]' (nvidia-modelopt with requests and huggingface_hub)"


def _modelopt_problem(module: str) -> str | None:
    from megatron_bridge.utils.packages import import_problem

    return import_problem(module)


@rule("quantization_needs_modelopt", ("quantization.quant_cfg",),
      "quantization.quant_cfg needs nvidia-modelopt (modelopt.torch.quantization imports).")
def _quant_modelopt(cfg: "ConfigContainer", world_size: int) -> None:
    q = cfg.quantization
    if q.quant_cfg is None:
        return
    problem = _modelopt_problem("modelopt.torch.quantization")
    if problem is not None:
        fail(f"quantization.quant_cfg={q.quant_cfg!r} needs nvidia-modelopt, which is not usable here ({problem}). "
             f"Fix: {MODELOPT_INSTALL}, or set quantization.quant_cfg=None", "quantization.quant_cfg")


@rule("quantization_cuda_formats", ("quantization.quant_cfg",),
      "quantization.quant_cfg 'nvfp4' and 'mxfp8' need CUDA; the other formats also run on CPU.")
def _quant_cuda(cfg: "ConfigContainer", world_size: int) -> None:
    q = cfg.quantization
    if q.quant_cfg is None or q.quant_cfg in CPU_QUANT_FORMATS:
        return
    from megatron_bridge.utils.packages import cuda_capability

    if cuda_capability() is None:
        fail(f"quantization.quant_cfg={q.quant_cfg!r} needs a CUDA device (modelopt's {q.quant_cfg} fake-quant "
             f"kernels are CUDA-only) and none is available: use one of {list(CPU_QUANT_FORMATS)} on CPU",
             "quantization.quant_cfg")


@rule("quantization_settings", ("quantization.calib_size", "quantization.quant_cfg",
                                "model.tensor_model_parallel_size", "model.context_parallel_size",
                                "model.pipeline_model_parallel_size", "dist.use_megatron_fsdp"),
      "Quantization calibrates on calib_size > 0 samples, with TP = CP = PP = 1 and DDP or FSDP2.")
def _quant_settings(cfg: "ConfigContainer", world_size: int) -> None:
    q = cfg.quantization
    if q.quant_cfg is None:
        return
    if q.calib_size <= 0:
        fail(f"quantization.calib_size must be > 0 (got {q.calib_size})", "quantization.calib_size")
    if cfg.model.tensor_model_parallel_size > 1:
        fail(f"quantization.quant_cfg={q.quant_cfg!r} is not supported with tensor parallelism (model.tensor_model_"
             f"parallel_size={cfg.model.tensor_model_parallel_size}) on the local engine: set TP=1",
             "quantization.quant_cfg", "model.tensor_model_parallel_size")
    if cfg.model.pipeline_model_parallel_size > 1:
        fail(f"quantization.quant_cfg={q.quant_cfg!r} is not supported with pipeline parallelism (model.pipeline_"
             f"model_parallel_size={cfg.model.pipeline_model_parallel_size}): set PP=1", "quantization.quant_cfg",
             "model.pipeline_model_parallel_size")
    if cfg.model.context_parallel_size > 1:
        fail(f"quantization.quant_cfg={q.quant_cfg!r} is not supported with context parallelism (model.context_"
             f"parallel_size={cfg.model.context_parallel_size}): set CP=1", "quantization.quant_cfg",
             "model.context_parallel_size")
    if cfg.dist.use_megatron_fsdp:
        fail(f"quantization.quant_cfg={q.quant_cfg!r} is not supported with Megatron FSDP: use DDP or "
             "dist.use_torch_fsdp2=True", "quantization.quant_cfg", "dist.use_megatron_fsdp")


@rule("distillation_needs_modelopt", ("distillation.teacher_checkpoint",),
      "distillation.teacher_checkpoint needs nvidia-modelopt (modelopt.torch.distill imports).")
def _kd_modelopt(cfg: "ConfigContainer", world_size: int) -> None:
    d = cfg.distillation
    if not d.enabled:
        return
    problem = _modelopt_problem("modelopt.torch.distill")
    if problem is not None:
        fail(f"distillation.teacher_checkpoint={d.teacher_checkpoint!r} needs nvidia-modelopt, which is not usable "
             f"here ({problem}). Fix: {MODELOPT_INSTALL}, or set distillation.teacher_checkpoint=None",
             "distillation.teacher_checkpoint")


@rule("distillation_settings", ("distillation.logit_kl_temperature", "distillation.kd_loss_scale",
                                "distillation.intermediate_layer_pairs", "model.tensor_model_parallel_size",
                                "model.context_parallel_size", "model.pipeline_model_parallel_size",
                                "dist.use_megatron_fsdp"),
      "Distillation: temperature and kd_loss_scale > 0, layer pairs of two names, TP = CP = PP = 1, DDP or FSDP2.")
def _kd_settings(cfg: "ConfigContainer", world_size: int) -> None:
    d = cfg.distillation
    if not d.enabled:
        return
    for path, value in (("distillation.logit_kl_temperature", d.logit_kl_temperature),
                        ("distillation.kd_loss_scale", d.kd_loss_scale)):
        if not value > 0:
            fail(f"{path} must be > 0 (got {value!r})", path)
    for pair in d.intermediate_layer_pairs:
        if len(pair) != 2 or not all(isinstance(n, str) and n for n in pair):
            fail(f"distillation.intermediate_layer_pairs entries are [student_module, teacher_module] (got {pair!r})",
                 "distillation.intermediate_layer_pairs")
    if cfg.model.tensor_model_parallel_size > 1:
        fail("distillation needs model.tensor_model_parallel_size=1 on the local engine (the logits loss needs the "
             f"whole vocabulary on each rank; got {cfg.model.tensor_model_parallel_size})",
             "distillation.teacher_checkpoint", "model.tensor_model_parallel_size")
    if cfg.model.pipeline_model_parallel_size > 1:
        fail("distillation needs model.pipeline_model_parallel_size=1 (the pipeline schedule computes the LM loss on "
             f"the last stage itself; got {cfg.model.pipeline_model_parallel_size})",
             "distillation.teacher_checkpoint", "model.pipeline_model_parallel_size")
    if cfg.model.context_parallel_size > 1:
        fail("distillation needs model.context_parallel_size=1 (the replicated teacher sees whole sequences; got "
             f"{cfg.model.context_parallel_size})", "distillation.teacher_checkpoint", "model.context_parallel_size")
    if cfg.dist.use_megatron_fsdp:
        fail("distillation is not supported with Megatron FSDP: use DDP or dist.use_torch_fsdp2=True",
             "distillation.teacher_checkpoint", "dist.use_megatron_fsdp")
