"""results.json of a performance run: throughput, model TFLOP/s, MFU, memory, loss; the comparison table; the plot."""

import json
import statistics
from pathlib import Path
from typing import Any

from megatron_bridge.config.container import ConfigContainer
from megatron_bridge.config.serialization import config_digest


# Dense peak TFLOP/s per device (vendor datasheets, without sparsity), by dtype.
PEAK_TFLOPS: dict[str, dict[str, float]] = {
    "H100": {"bfloat16": 989.0, "float16": 989.0, "float32": 67.0},
    "H200": {"bfloat16": 989.0, "float16": 989.0, "float32": 67.0},
    "H20": {"bfloat16": 148.0, "float16": 148.0, "float32": 44.0},
    "B200": {"bfloat16": 2250.0, "float16": 2250.0, "float32": 80.0},
    "GB200": {"bfloat16": 2500.0, "float16": 2500.0, "float32": 80.0},
    "A100": {"bfloat16": 312.0, "float16": 312.0, "float32": 19.5},
    "L40S": {"bfloat16": 362.0, "float16": 362.0, "float32": 91.6},
}


def peak_tflops(device_name: str | None, dtype: str) -> float | None:
    """The table's peak for a CUDA device name (longest matching key), or None (CPU, unknown device)."""
    if not device_name:
        return None
    matches = [k for k in PEAK_TFLOPS if k.lower() in device_name.lower()]
    if not matches:
        return None
    return PEAK_TFLOPS[max(matches, key=len)].get(dtype)


def build_results(cfg: ConfigContainer, result: Any, *, device_name: str | None, warmup_steps: int = 3) -> dict:
    """The results.json content of a finished run (``result`` is a TrainResult)."""
    times = result.step_times[warmup_steps:] or result.step_times
    step_time = statistics.median(times) if times else float("nan")
    world = result.world_size
    tokens_per_s_device = result.tokens_per_step / step_time / world
    tflops_device = result.flops_per_step / step_time / world / 1e12
    dtype = cfg.mixed_precision_config.compute_dtype if cfg.mixed_precision_config else "float32"
    peak = peak_tflops(device_name, dtype)
    return {
        "recipe_digest": config_digest(cfg)[:16],
        "device": device_name or "cpu",
        "compute_dtype": dtype,
        "world_size": world,
        "backend": result.backend,
        "global_batch_size": cfg.train.global_batch_size,
        "seq_length": cfg.model.seq_length,
        "steps": len(result.step_times),
        "first_step": result.steps[0] if result.steps else None,
        "step_times_s": result.step_times,
        "median_step_time_s": step_time,
        "tokens_per_s_per_device": tokens_per_s_device,
        "model_tflops_per_s_per_device": tflops_device,
        "peak_tflops_per_device": peak,
        "mfu": tflops_device / peak if peak else None,
        "peak_memory_gib": result.peak_memory_bytes / 2**30,
        "losses": result.losses,
        "final_loss": result.final_loss,
    }


def join_slices(earlier: dict, later: dict) -> dict:
    """``later`` (a run resumed from a checkpoint) with the per-step entries of ``earlier`` (the same config's
    results.json from before the resume) for the steps before ``later``'s first: one loss curve over a run that
    Slurm jobs or restarts cut into slices. ``later`` unchanged when ``earlier`` is another config's or leaves a gap."""
    first, start = later.get("first_step"), earlier.get("first_step")
    if first is None or start is None or earlier.get("recipe_digest") != later.get("recipe_digest"):
        return later
    keep = first - start
    if keep <= 0 or len(earlier["losses"]) < keep or len(earlier["step_times_s"]) < keep:
        return later
    joined = dict(later)
    joined["losses"] = earlier["losses"][:keep] + later["losses"]
    joined["step_times_s"] = earlier["step_times_s"][:keep] + later["step_times_s"]
    joined["steps"], joined["first_step"] = len(joined["losses"]), start
    return joined


def write_results(results: dict, output_dir: str | Path) -> tuple[Path, Path | None]:
    """Write results.json and a PNG of loss and step time; returns both paths (plot None without matplotlib)."""
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    json_path = out / "results.json"
    json_path.write_text(json.dumps(results, indent=2))
    return json_path, plot_results(results, out / "results.png")


def plot_results(results: dict, path: Path) -> Path | None:
    """Loss and step time over steps, side by side."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    steps = list(range(1, len(results["losses"]) + 1))
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    ax1.plot(steps, results["losses"])
    ax1.set(xlabel="step", ylabel="loss", title="training loss")
    ax2.plot(steps, [t * 1000 for t in results["step_times_s"]])
    ax2.set(xlabel="step", ylabel="ms", title="step time")
    fig.suptitle(f"{results['backend']} x{results['world_size']} on {results['device']}")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


def summary_line(results: dict) -> str:
    """The one-line summary printed last."""
    mfu = f"{results['mfu'] * 100:.1f}%" if results["mfu"] is not None else "n/a"
    return (f"SUMMARY backend={results['backend']} world={results['world_size']} device={results['device']} "
            f"step={results['median_step_time_s'] * 1000:.1f}ms "
            f"tokens/s/device={results['tokens_per_s_per_device']:.0f} "
            f"TFLOP/s/device={results['model_tflops_per_s_per_device']:.3f} MFU={mfu} "
            f"peak_mem={results['peak_memory_gib']:.2f}GiB final_loss={results['final_loss']:.4f}")


COMPARED = ("median_step_time_s", "tokens_per_s_per_device", "model_tflops_per_s_per_device", "mfu",
            "peak_memory_gib", "final_loss")


def read_results(path: str | Path, what: str = "--compare") -> dict:
    """A results.json written by :func:`write_results`.

    Raises:
        PathError: the file is missing, not a regular file, or not a results file (not JSON, or none of the
            compared metrics).
    """
    from megatron_bridge.errors import PathError
    from megatron_bridge.utils.paths import check_input_file

    check_input_file(path, what)
    try:
        content = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise PathError(f"{what}={str(path)!r} is not a results file (not JSON: {exc})") from None
    if not isinstance(content, dict) or not any(key in content for key in COMPARED):
        raise PathError(f"{what}={str(path)!r} is not a results file: it has none of {list(COMPARED)} (give the "
                        "results.json a run of launch.py wrote)")
    return content


def compare(a: dict, b: dict) -> str:
    """Ratio table B / A of the main metrics."""
    lines = [f"{'metric':32s} {'A':>14s} {'B':>14s} {'B/A':>8s}"]
    for key in COMPARED:
        va, vb = a.get(key), b.get(key)
        ratio = f"{vb / va:8.3f}" if isinstance(va, int | float) and isinstance(vb, int | float) and va else "     n/a"
        fa = f"{va:14.4g}" if isinstance(va, int | float) else f"{'n/a':>14s}"
        fb = f"{vb:14.4g}" if isinstance(vb, int | float) else f"{'n/a':>14s}"
        lines.append(f"{key:32s} {fa} {fb} {ratio}")
    return "\n".join(lines)
