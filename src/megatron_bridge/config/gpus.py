"""The GPUs the dry-run estimate knows (``profiling.estimate_gpu``, launch.py's ``-g/--gpu``): their memory and how a
name is looked up. Pure data, so rule ``profiling_settings`` and :mod:`megatron_bridge.perf.estimate` share it."""

GPU_MEMORY_GIB: dict[str, float] = {
    "H100": 79.6, "H200": 139.8, "H20": 95.0, "B200": 178.4, "GB200": 184.0, "A100": 79.2, "L40S": 44.4,
}
"""Device memory a process can allocate (GiB), per GPU of :data:`~megatron_bridge.perf.results.PEAK_TFLOPS`
(the datasheet's GB less what the driver reserves, as ``torch.cuda.get_device_properties().total_memory`` reports)."""
DEFAULT_GPU = "H100"


def find_gpu(name: str | None) -> str | None:
    """Table key of a GPU name (``h100``, ``NVIDIA H100 80GB HBM3``: the longest match; None: H100), or None when
    the table has no such GPU."""
    wanted = (name or DEFAULT_GPU).strip().lower()
    matches = [k for k in GPU_MEMORY_GIB if k.lower() in wanted or wanted == k.lower()]
    return max(matches, key=len) if matches else None


def known_gpus() -> list[str]:
    """The names the table knows, lower case."""
    return sorted(k.lower() for k in GPU_MEMORY_GIB)
