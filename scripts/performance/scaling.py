#!/usr/bin/env python3
"""Scaling benchmark: per-rank memory (measured vs the dry-run estimate) and tokens/s at 1, 2 and 4 processes.

    python scripts/performance/scaling.py --output-dir runs/scaling            # every model and layout, 1/2/4 ranks
    python scripts/performance/scaling.py --models tiny --world-sizes 1 2      # a quick subset

For each model (``tiny``: the tiny_llama recipe, 0.84M parameters; ``100m``: a Llama-shaped 100M model;
``tiny_moe``: the tiny_moe recipe, 8 experts) and each layout that runs on this machine (DDP; FSDP2 with
``fsdp2.reshard_after_forward`` None / true / false; FSDP2 x TP 2; Megatron FSDP on GPUs; PP 2 with 1F1B (DDP and
FSDP2) and PP 2 x VP 2 (Interleaved1F1B); CP 2 (DDP and FSDP2); EP 2 (DDP and FSDP2, ``tiny_moe`` only; the dense
layouts of ``tiny_moe`` are DDP and FSDP2) - a layout the config refuses is a row that says why it was skipped),
every world size launches ``torch.distributed.run``; each rank trains twice through ``pretrain()``:
unprofiled for tokens/s (median step after the first), then profiled for memory (:mod:`megatron_bridge.perf.measure`:
peak = allocator events summed in time order during training; state = storage accounting of parameters, gradients
and optimizer state at the end of the last step). The largest
rank is compared with :func:`megatron_bridge.perf.memory.estimate_memory` (the dry-run estimate). Writes
``scaling.json`` and ``scaling.png`` to ``--output-dir``, prints the table, the error ranges and the FSDP2-vs-DDP
state ratio at the largest world size (goal <= 0.30 at 4 ranks). A benchmark, not a test: it takes minutes.
"""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


LAYOUTS: dict[str, list[str]] = {
    "ddp": [],
    "fsdp2": ["dist.use_torch_fsdp2=true"],
    "fsdp2_reshard_true": ["dist.use_torch_fsdp2=true", "fsdp2.reshard_after_forward=true"],
    "fsdp2_reshard_false": ["dist.use_torch_fsdp2=true", "fsdp2.reshard_after_forward=false"],
    "fsdp2_tp2": ["dist.use_torch_fsdp2=true", "model.tensor_model_parallel_size=2"],
    "megatron_fsdp": ["dist.use_megatron_fsdp=true", "ddp.use_megatron_fsdp=true",
                      "ddp.data_parallel_sharding_strategy=optim_grads_params"],
    "pp2": ["model.pipeline_model_parallel_size=2"],
    "pp2_vp2": ["model.pipeline_model_parallel_size=2", "model.virtual_pipeline_model_parallel_size=2"],
    "fsdp2_pp2": ["dist.use_torch_fsdp2=true", "model.pipeline_model_parallel_size=2"],
    "cp2": ["model.context_parallel_size=2"],
    "fsdp2_cp2": ["dist.use_torch_fsdp2=true", "model.context_parallel_size=2"],
    "ep2": ["model.expert_model_parallel_size=2"],
    "fsdp2_ep2": ["dist.use_torch_fsdp2=true", "model.expert_model_parallel_size=2"],
}
"""Layout name -> overrides on top of the model's benchmark config."""
MIN_WORLD = {"fsdp2_tp2": 2, "pp2": 2, "pp2_vp2": 2, "fsdp2_pp2": 2, "cp2": 2, "fsdp2_cp2": 2, "ep2": 2,
             "fsdp2_ep2": 2}
MODELS = ("tiny", "100m", "tiny_moe")
MOE_LAYOUTS = ("ddp", "fsdp2", "ep2", "fsdp2_ep2")
"""The layouts of the MoE model (expert-parallel layouts need experts: they run only there)."""


def applies(model: str, layout: str) -> bool:
    """Whether ``layout`` is benchmarked for ``model``."""
    return layout in MOE_LAYOUTS if model == "tiny_moe" else "ep2" not in layout


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command line."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    p.add_argument("--world-sizes", nargs="+", type=int, default=[1, 2, 4])
    p.add_argument("--layouts", nargs="+", default=list(LAYOUTS), choices=list(LAYOUTS))
    p.add_argument("--only", nargs="+", default=None, metavar="MODEL:LAYOUT:N",
                   help="run just these combinations (e.g. 100m:fsdp2:4), in this order")
    p.add_argument("--output-dir", default="runs/scaling")
    p.add_argument("--timeout", type=int, default=900, help="seconds per launch")
    p.add_argument("--rescore", metavar="SCALING_JSON", default=None,
                   help="recompute the estimate columns and errors of an existing scaling.json with the current "
                        "estimate (same measurements), rewrite it and its plot, print the table; runs nothing")
    p.add_argument("--worker", nargs=3, metavar=("MODEL", "LAYOUT", "OUT"), help=argparse.SUPPRESS)
    return p.parse_args(argv)


def build_config(model: str, layout: str, steps: int | None = None):  # noqa: ANN201  (ConfigContainer)
    """The benchmark config of ``model`` with ``layout``'s overrides (fp32, mock data, no checkpoints/eval)."""
    from megatron_bridge.recipes import tiny_llama_pretrain_config, tiny_moe_pretrain_config
    from megatron_bridge.recipes.perf import common_perf_overrides

    if model == "tiny":
        cfg = tiny_llama_pretrain_config(global_batch_size=16, micro_batch_size=4)
        default_steps = 5
    elif model == "tiny_moe":  # 8 SwiGLU experts of width 96, top-2; EP 1 unless the layout says otherwise
        cfg = tiny_moe_pretrain_config(global_batch_size=16, micro_batch_size=4, expert_model_parallel_size=1)
        default_steps = 5
    else:  # ~100M parameters: 12 blocks of width 768, GQA 12/4 heads, SwiGLU 2048, vocabulary 16000
        cfg = tiny_llama_pretrain_config(global_batch_size=4, micro_batch_size=1, seq_length=128)
        m = cfg.model
        m.num_layers, m.hidden_size, m.ffn_hidden_size = 12, 768, 2048
        m.num_attention_heads, m.num_query_groups, m.vocab_size = 12, 4, 16000
        default_steps = 2
    cfg = common_perf_overrides(cfg, train_iters=steps or default_steps, warmup_iters=1)
    cfg.logger.logging_level = "WARNING"
    cfg.logger.log_progress = False
    return cfg.apply_overrides(overrides=LAYOUTS[layout])


# ------------------------------------------------------------------------------------------------------- worker
def worker(model: str, layout: str, out: str) -> int:
    """One rank: an unprofiled run for tokens/s, a profiled one for memory; writes ``OUT.rank<R>.json``."""
    import torch
    import torch.distributed as dist

    from megatron_bridge.errors import MegatronBridgeError
    from megatron_bridge.perf.measure import AllocationRecorder
    from megatron_bridge.training.pretrain import pretrain
    from megatron_bridge.utils.launch import end_worker, finish_worker

    rank = int(os.environ.get("RANK", "0"))
    # The worker owns the process group, so the two pretrain() calls reuse it (as overhead.py does).
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    cfg = build_config(model, layout)
    try:
        result = pretrain(cfg)
    except MegatronBridgeError as exc:  # a layout this version refuses at build time: a skipped row, not a failure
        Path(f"{out}.rank{rank}.json").write_text(json.dumps({"skipped": str(exc).splitlines()[0][:200]}))
        return finish_worker(0)
    times = result.step_times[1:] or result.step_times
    step = statistics.median(times)
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if torch.cuda.is_available() else \
        torch.device("cpu")
    with AllocationRecorder(device) as recorder:
        pretrain(build_config(model, layout, steps=2), callbacks=[recorder])
    mem = recorder.result()
    row = {"rank": rank, "step_time_s": step, "tokens_per_s": cfg.train.global_batch_size * cfg.model.seq_length / step,
           "peak_bytes": mem.peak_bytes, "state_bytes": mem.state_bytes, "final_loss": result.final_loss}
    Path(f"{out}.rank{rank}.json").write_text(json.dumps(row))
    return end_worker(0)


# ------------------------------------------------------------------------------------------------------- driver
def _estimate(cfg: Any, world: int) -> dict[str, Any]:
    from megatron_bridge.perf.memory import estimate_memory

    est = estimate_memory(cfg, world)
    return {"est_state_bytes": est.state_bytes, "est_peak_bytes": est.peak_bytes,
            "est_param_bytes": est.param_bytes, "est_grad_bytes": est.grad_bytes,
            "est_optimizer_bytes": est.optimizer_bytes, "est_activation_bytes": est.activations.peak_bytes,
            "est_buffer_bytes": est.buffer_bytes, "model_parameters": est.params.model_total}


def run_one(model: str, layout: str, world: int, timeout: int, tmp: str) -> dict[str, Any]:
    """Validate, launch ``world`` ranks, merge their rows (largest rank) with the estimate."""
    import torch

    from megatron_bridge.errors import MegatronBridgeError
    from megatron_bridge.utils.launch import reserved_port

    row: dict[str, Any] = {"model": model, "layout": layout, "world_size": world}
    if layout == "megatron_fsdp" and not torch.cuda.is_available():
        return {**row, "status": "skipped: Megatron FSDP needs CUDA"}
    try:
        cfg = build_config(model, layout).validate(world_size=world)
    except (MegatronBridgeError, ValueError) as exc:
        return {**row, "status": f"skipped: {str(exc).splitlines()[0][:160]}"}
    row.update(_estimate(cfg, world))
    out = os.path.join(tmp, f"{model}-{layout}-{world}")
    env = dict(os.environ, OMP_NUM_THREADS=str(max(1, (os.cpu_count() or 1) // world)), PYTHONUNBUFFERED="1")
    t0 = time.time()
    with reserved_port() as port:
        cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={world}", "--master_addr=127.0.0.1",
               f"--master_port={port}", os.path.abspath(__file__), "--worker", model, layout, out]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    ranks = [json.loads(Path(f"{out}.rank{r}.json").read_text()) for r in range(world)
             if Path(f"{out}.rank{r}.json").exists()]
    if ranks and "skipped" in ranks[0]:
        return {**row, "status": f"skipped: {ranks[0]['skipped']}"}
    if proc.returncode != 0 or len(ranks) != world:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        return {**row, "status": f"failed: {tail[0][:200]}"}
    row.update(status="ok", wall_s=round(time.time() - t0, 1),
               peak_bytes=max(r["peak_bytes"] for r in ranks), state_bytes=max(r["state_bytes"] for r in ranks),
               tokens_per_s=ranks[0]["tokens_per_s"], step_time_s=ranks[0]["step_time_s"])
    return _errors(row)


def _errors(row: dict[str, Any]) -> dict[str, Any]:
    row["state_error"] = row["est_state_bytes"] / row["state_bytes"] - 1
    row["peak_error"] = row["est_peak_bytes"] / row["peak_bytes"] - 1
    return row


def rescore(path: Path) -> list[dict[str, Any]]:
    """The rows of ``path`` with the estimate of the current code (measured columns unchanged)."""
    rows = json.loads(path.read_text())["rows"]
    for row in rows:
        if row.get("status") == "ok":
            cfg = build_config(row["model"], row["layout"]).validate(world_size=row["world_size"])
            row.update(_errors({**row, **_estimate(cfg, row["world_size"])}))
    return rows


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Error ranges and the FSDP2 / DDP state ratio at the largest world size, per model."""
    ok = [r for r in rows if r.get("status") == "ok"]
    out: dict[str, Any] = {}
    if ok:
        out["state_error_range"] = [min(r["state_error"] for r in ok), max(r["state_error"] for r in ok)]
        out["peak_error_range"] = [min(r["peak_error"] for r in ok), max(r["peak_error"] for r in ok)]
    for model in {r["model"] for r in ok}:
        by = {(r["layout"], r["world_size"]): r for r in ok if r["model"] == model}
        worlds = [w for (lay, w) in by if lay == "fsdp2" and ("ddp", w) in by]
        if worlds:
            w = max(worlds)
            out[f"{model}_fsdp2_over_ddp_state_at_{w}"] = by[("fsdp2", w)]["state_bytes"] / by[("ddp", w)][
                "state_bytes"]
    return out


def plot(rows: list[dict[str, Any]], path: Path) -> Path | None:
    """Per-rank state (measured solid, estimated dashed) and tokens/s against world size, one row per model."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    ok = [r for r in rows if r.get("status") == "ok"]
    models = sorted({r["model"] for r in ok})
    if not models:
        return None
    fig, axes = plt.subplots(len(models), 2, figsize=(12, 4 * len(models)), squeeze=False)
    for (ax_mem, ax_tps), model in zip(axes, models, strict=True):
        for layout in LAYOUTS:
            pts = sorted((r["world_size"], r) for r in ok if r["model"] == model and r["layout"] == layout)
            if not pts:
                continue
            ws = [w for w, _ in pts]
            line = ax_mem.plot(ws, [r["state_bytes"] / 2**20 for _, r in pts], "o-", label=layout)[0]
            ax_mem.plot(ws, [r["est_state_bytes"] / 2**20 for _, r in pts], "--", color=line.get_color())
            ax_tps.plot(ws, [r["tokens_per_s"] for _, r in pts], "o-", label=layout)
        ax_mem.set(xlabel="processes", ylabel="MiB per rank", title=f"{model}: params+grads+optimizer (-- estimate)",
                   xscale="log", yscale="log")
        ax_tps.set(xlabel="processes", ylabel="tokens/s (all ranks)", title=f"{model}: throughput", xscale="log")
        ax_mem.legend(fontsize=7)
        ax_tps.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


def _print_table(rows: list[dict[str, Any]]) -> None:
    print(f"{'model':6s} {'layout':20s} {'N':>2s} {'state MiB':>10s} {'est':>8s} {'err':>7s} {'peak MiB':>9s} "
          f"{'est':>8s} {'err':>7s} {'tokens/s':>9s}  status")
    for r in rows:
        if r.get("status") != "ok":
            print(f"{r['model']:6s} {r['layout']:20s} {r['world_size']:>2d}  {r['status']}")
            continue
        print(f"{r['model']:6s} {r['layout']:20s} {r['world_size']:>2d} {r['state_bytes'] / 2**20:10.1f} "
              f"{r['est_state_bytes'] / 2**20:8.1f} {r['state_error']:+7.1%} {r['peak_bytes'] / 2**20:9.1f} "
              f"{r['est_peak_bytes'] / 2**20:8.1f} {r['peak_error']:+7.1%} {r['tokens_per_s']:9.0f}  ok")


def main(argv: list[str] | None = None) -> int:
    """Entry point: the driver, or one rank with ``--worker``."""
    args = parse_args(argv)
    if args.worker:
        return worker(*args.worker)
    if args.rescore:
        path = Path(args.rescore)
        rows = rescore(path)
        result = write_json(rows, path, json.loads(path.read_text()))
        plot(rows, path.with_suffix(".png"))
        _print_table(rows)
        print(json.dumps(result["summary"], indent=2))
        return 0
    plan = [(m, lay, w) for m in args.models for w in args.world_sizes for lay in args.layouts
            if w >= MIN_WORLD.get(lay, 1) and applies(m, lay)]
    if args.only:
        plan = [(m, lay, int(w)) for m, lay, w in (x.split(":") for x in args.only)]
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for model, layout, world in plan:
            rows.append(run_one(model, layout, world, args.timeout, tmp))
            print(json.dumps({k: rows[-1].get(k) for k in ("model", "layout", "world_size", "status", "state_error",
                                                          "peak_error")}), flush=True)
            write_json(rows, out / "scaling.json")  # after every row: a long run that is stopped keeps its rows
    result = write_json(rows, out / "scaling.json")
    png = plot(rows, out / "scaling.png")
    _print_table(rows)
    print(json.dumps(result["summary"], indent=2))
    print(f"wrote {out / 'scaling.json'}" + (f" and {png}" if png else ""))
    return 0 if all(r["status"] == "ok" or r["status"].startswith("skipped") for r in rows) else 1


def write_json(rows: list[dict[str, Any]], path: Path, measured: dict[str, Any] | None = None) -> dict[str, Any]:
    """scaling.json: when, where, how it was measured, the rows and the summary (``measured``: keep the date and
    machine of an earlier measurement, for ``--rescore``)."""
    import torch

    result = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": platform.platform(),
              "cpus": os.cpu_count(), "torch": torch.__version__,
              "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
              "method": "peak: allocator events of torch.profiler(profile_memory=True) summed in time order; state: "
                        "storage accounting of parameters, gradients and optimizer state at the end of the last "
                        "step (megatron_bridge.perf.measure); largest rank", "rows": rows, "summary": summary(rows)}
    if measured is not None:
        result.update({k: measured[k] for k in ("date", "machine", "cpus", "torch", "device") if k in measured})
        result["rescored"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    path.write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    from megatron_bridge.utils.cli import run_cli

    sys.exit(run_cli(main))
