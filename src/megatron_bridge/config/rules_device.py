"""Validation rules about the machine a config runs on: settings that only work with a CUDA device or an
accelerator, and output paths its file system can hold (rule ``output_paths``). Set-up would refuse them too
(``distributed/init.py``, ``distributed/context_parallel.py``, ``distributed/fsdp2.py``); these rules refuse them in
``validate()``, before any process group or model exists, so a dry run on the same machine already names the
problem. The probes (``cuda_capability`` and
``accelerator_available`` in :mod:`megatron_bridge.utils.packages`) import torch lazily, only for configs that ask.
"""

from typing import TYPE_CHECKING

from megatron_bridge.config.rule_registry import fail, positive, rule


if TYPE_CHECKING:
    from megatron_bridge.config.container import ConfigContainer


def _has_cuda() -> bool:
    from megatron_bridge.utils import packages

    return packages.cuda_capability() is not None


@rule("nccl_needs_cuda", ("dist.distributed_backend",),
      "dist.distributed_backend='nccl' needs a CUDA device on this machine.")
def _nccl_needs_cuda(cfg: "ConfigContainer", world_size: int) -> None:
    if cfg.dist.distributed_backend == "nccl" and not _has_cuda():
        fail("dist.distributed_backend='nccl' needs a CUDA device, and this machine has none: set "
             "dist.distributed_backend='gloo' or None (auto picks gloo without CUDA)", "dist.distributed_backend")


@rule("cp_ring_needs_cuda", ("model.cp_comm_type", "model.context_parallel_size", "dist.distributed_backend"),
      "model.cp_comm_type='p2p' (ring attention) with context_parallel_size > 1 needs ranks on CUDA (nccl).")
def _cp_ring_needs_cuda(cfg: "ConfigContainer", world_size: int) -> None:
    m = cfg.model
    if m.engine != "native" or m.context_parallel_size <= 1 or m.cp_comm_type != "p2p":
        return
    backend = cfg.dist.distributed_backend
    if backend == "gloo" or not _has_cuda():
        where = ("dist.distributed_backend='gloo' puts every rank on the CPU" if backend == "gloo"
                 else "this machine has no CUDA device")
        fail(f"model.cp_comm_type='p2p' with model.context_parallel_size={m.context_parallel_size}: PyTorch's ring "
             f"attention runs only on CUDA, and {where}: set model.cp_comm_type='all_gather' (exact on every device)",
             "model.cp_comm_type", "dist.distributed_backend")


@rule("fsdp2_pin_memory_needs_accelerator", ("fsdp2.offload_policy.pin_memory", "dist.use_torch_fsdp2"),
      "fsdp2.offload_policy.pin_memory=True needs an accelerator (pinned host memory).")
def _pin_memory(cfg: "ConfigContainer", world_size: int) -> None:
    policy = cfg.fsdp2.offload_policy
    if not (cfg.dist.use_torch_fsdp2 and getattr(policy, "pin_memory", False)):  # a torch OffloadPolicy too
        return
    from megatron_bridge.utils import packages

    if not packages.accelerator_available():
        fail("fsdp2.offload_policy.pin_memory=True needs an accelerator (pinned host memory), and this machine has "
             "none: set fsdp2.offload_policy.pin_memory=False", "fsdp2.offload_policy.pin_memory")


OUTPUT_FOLDERS = ("checkpoint.save", "logger.tensorboard_dir", "profiling.trace_dir", "dataset.cache_dir")
"""Config fields naming a folder the run writes into."""
OUTPUT_FILES = ("logger.save_config_filepath",)
"""Config fields naming a file the run writes."""


@rule("output_paths", OUTPUT_FOLDERS + OUTPUT_FILES + ("profiling.memory_snapshot_path",),
      "Output folders and files can be created here: not under a regular file, not in /proc, /sys or /dev, a folder "
      "where a folder is written (a file where a file is).")
def _output_paths(cfg: "ConfigContainer", world_size: int) -> None:
    from megatron_bridge.utils.paths import output_path_problem

    files = OUTPUT_FILES + (("profiling.memory_snapshot_path",) if cfg.profiling.record_memory_history else ())
    for path in OUTPUT_FOLDERS + files:
        section, name = path.split(".")
        value = getattr(getattr(cfg, section), name)
        problem = output_path_problem(value, folder=path in OUTPUT_FOLDERS) if value else None
        if problem:
            fail(f"{path}={value!r} cannot be written: {problem}", path)


INDEX_BYTES_PER_SAMPLE = 20
"""The least memory a real dataset's indices take per sample (``GPTDataset``: the sample index, 2 × int64, and the
shuffle index, uint32), built whole by every rank before the first step; building them needs about three times
that."""


def machine_memory_bytes() -> int | None:
    """This machine's physical memory in bytes (None where the OS does not say)."""
    import os

    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


@rule("data_index_fits_memory", ("train.train_iters", "train.train_samples", "train.global_batch_size",
                                 "dataset.mock"),
      "With real data (dataset.mock=False), the dataset indices of the samples the run reads (20 bytes each at "
      "least) fit this machine's memory.")
def _data_index_fits_memory(cfg: "ConfigContainer", world_size: int) -> None:
    from megatron_bridge.config.rules import run_samples

    t, v = cfg.train, cfg.validation
    if (cfg.dataset.mock or not positive(t.global_batch_size) or cfg.train_iters <= 0 or v.eval_iters < 0
            or (v.eval_interval is not None and not positive(v.eval_interval))):
        return  # mock data has no index; positive_sizes and train_length name bad sizes
    memory = machine_memory_bytes()
    train, valid = run_samples(cfg)
    need = (train + valid) * INDEX_BYTES_PER_SAMPLE
    if memory is None or need <= memory:
        return
    length = "train.train_samples" if t.train_samples is not None else "train.train_iters"
    most = memory // INDEX_BYTES_PER_SAMPLE // t.global_batch_size // (2 if valid else 1)
    gib = 1024 ** 3
    fail(f"{length}={getattr(t, length.split('.')[1])} with train.global_batch_size={t.global_batch_size} reads "
         f"{train} training and {valid} validation samples: with real data (dataset.mock=False) every rank builds "
         f"dataset indices of at least {INDEX_BYTES_PER_SAMPLE} bytes per sample = {need / gib:.1f} GiB, more than "
         f"this machine's {memory / gib:.1f} GiB of memory. Fix: lower {length} (about {most} steps fit) or "
         "train.global_batch_size", length, "train.global_batch_size")
