"""Validation rules about the machine a config runs on: settings that only work with a CUDA device or an
accelerator, and output paths its file system can hold (rule ``output_paths``). Set-up would refuse them too
(``distributed/init.py``, ``distributed/context_parallel.py``, ``distributed/fsdp2.py``); these rules refuse them in
``validate()``, before any process group or model exists, so a dry run on the same machine already names the
problem. The probes (``cuda_capability`` and
``accelerator_available`` in :mod:`megatron_bridge.utils.packages`) import torch lazily, only for configs that ask.
"""

from typing import TYPE_CHECKING

from megatron_bridge.config.rule_registry import fail, rule


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
