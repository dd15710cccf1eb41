"""Overrides the performance harness applies (Megatron-Bridge parity), one function each."""

from megatron_bridge.config.container import ConfigContainer


def megatron_fsdp_overrides(cfg: ConfigContainer) -> ConfigContainer:
    """What ``--use_megatron_fsdp true`` applies, as Megatron-Bridge's perf harness does (seed megatron-fsdp-skill):

    ``dist.use_megatron_fsdp`` and ``ddp.use_megatron_fsdp`` True, ``ddp.data_parallel_sharding_strategy=
    "optim_grads_params"``, ``ddp.keep_fp8_transpose_cache=False``, ``ddp.average_in_collective=False``,
    ``model.init_model_with_meta_device=True``, ``checkpoint.load=None`` and ``checkpoint.ckpt_format=
    "fsdp_dtensor"`` (Megatron-Bridge leaves the format alone, so saving then fails validation; we set it). The
    recipe's parallel layout is kept: Megatron FSDP shards over the data × context-parallel ranks, so llama3_8b keeps
    its CP=2.
    """
    cfg.dist.use_megatron_fsdp = True
    cfg.dist.use_torch_fsdp2 = False
    cfg.ddp.use_megatron_fsdp = True
    cfg.ddp.data_parallel_sharding_strategy = "optim_grads_params"
    cfg.ddp.keep_fp8_transpose_cache = False
    cfg.ddp.average_in_collective = False
    cfg.model.init_model_with_meta_device = True
    cfg.checkpoint.load = None
    cfg.checkpoint.ckpt_format = "fsdp_dtensor"
    return cfg


def common_perf_overrides(cfg: ConfigContainer, *, train_iters: int = 50, warmup_iters: int = 10) -> ConfigContainer:
    """Benchmark settings: no checkpoint saving, a log line every step, NaN checks off, a short warmup."""
    cfg.train.train_iters = train_iters
    cfg.train.train_samples = None
    cfg.checkpoint.save = None
    cfg.checkpoint.load = None
    cfg.logger.log_interval = 1
    cfg.logger.tensorboard_dir = None
    cfg.ddp.check_for_nan_in_grad = False
    cfg.validation.eval_interval = None
    cfg.scheduler.lr_warmup_iters = min(warmup_iters, max(train_iters - 1, 0))
    cfg.scheduler.lr_warmup_fraction = None
    cfg.scheduler.lr_decay_iters = train_iters
    return cfg
