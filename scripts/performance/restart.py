#!/usr/bin/env python3
"""Cost of an automatic restart and of a preemption save, measured side by side in one run.

    python scripts/performance/restart.py [--nproc 2] [--steps 10] [--at 7] [--save_interval 5] [--rounds 3] [k=v ...]

Each round runs two jobs of the tiny recipe through ``python -m megatron_bridge.launcher.torchrun`` (what
``run_recipe.py`` and ``launch.py`` use), one after the other, so machine noise hits both alike:

* **restart**: ``--max_restarts 1``; rank 1 sends itself SIGKILL at step ``--at`` of the first attempt. Measured:
  seconds from the kill to the end of the first step after the restart (torch's agent notices the failure, stops the
  other workers, starts new ones, which initialize, build the model, load the last checkpoint and train one step),
  and to the restarted workers' start of training (set-up and checkpoint load done).
* **preemption**: ``train.exit_signal=SIGUSR1``; at step ``--at`` rank 0 sends SIGUSR1 to its launcher (as Slurm's
  pre-time-limit signal would), which forwards it. Measured: seconds from the signal to the checkpoint saved at the
  agreed step, and to the end of the job.

Reported: the median over the rounds of each, and the median step time. Trailing ``key=value`` overrides apply to
the tiny recipe. Numbers go to docs/training/multi-node.md.
"""

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command line."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nproc", type=int, default=2, help="processes per job")
    p.add_argument("--steps", type=int, default=10, help="steps per job")
    p.add_argument("--at", type=int, default=7, help="the step at which the worker is killed / the signal is sent")
    p.add_argument("--save_interval", type=int, default=5, help="checkpoint every this many steps")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--worker", choices=("restart", "preempt"), default=None, help=argparse.SUPPRESS)
    p.add_argument("--events", default=None, help=argparse.SUPPRESS)
    p.add_argument("overrides", nargs="*")
    return p.parse_args(argv)


# ------------------------------------------------------------------------------------------------ worker side
def _note(events: str, name: str, **fields: object) -> None:
    with open(events, "a") as f:
        f.write(json.dumps({"event": name, "t": time.time(), **fields}) + "\n")


def _callback(args: argparse.Namespace):  # noqa: ANN202
    from megatron_bridge.training.callbacks import Callback

    rank, attempt = int(os.environ["RANK"]), int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))

    class Probe(Callback):
        """Records the events the parent turns into seconds."""

        def __init__(self) -> None:
            self.first = True

        def on_train_start(self, ctx) -> None:  # noqa: ANN001
            if rank == 0 and attempt > 0:
                _note(args.events, "resumed", step=ctx.train_state.step)

        def on_train_step_end(self, ctx) -> None:  # noqa: ANN001
            step = ctx.train_state.step
            if rank == 0:
                _note(args.events, "step", step=step, seconds=ctx.step_metrics.step_time, attempt=attempt)
            if rank == 0 and attempt > 0 and self.first:
                _note(args.events, "first_step_after_restart", step=step)
            self.first = False
            if step == args.at and attempt == 0:
                if args.worker == "restart" and rank == 1:
                    _note(args.events, "kill", step=step)
                    os.kill(os.getpid(), signal.SIGKILL)
                if args.worker == "preempt" and rank == 0:
                    _note(args.events, "signal", step=step)
                    os.kill(os.getppid(), signal.SIGUSR1)  # the launcher forwards it to every worker

        def on_train_end(self, ctx) -> None:  # noqa: ANN001
            if rank == 0:
                _note(args.events, "saved", step=ctx.train_state.step)

    return Probe()


def worker(args: argparse.Namespace) -> int:
    """Train the tiny recipe with checkpoints; misbehave as ``--worker`` says."""
    from megatron_bridge.recipes import tiny_llama_pretrain_config
    from megatron_bridge.training.pretrain import pretrain
    from megatron_bridge.utils.launch import finish_worker

    run_dir = Path(args.events).parent
    cfg = tiny_llama_pretrain_config(dir=str(run_dir), train_iters=args.steps)
    cfg.checkpoint.save_interval = args.save_interval
    cfg.validation.eval_interval = None
    cfg.logger.tensorboard_dir = None
    if args.worker == "preempt":
        cfg.train.exit_signal_handler, cfg.train.exit_signal = True, "SIGUSR1"
    cfg = cfg.apply_overrides(None, args.overrides)
    pretrain(cfg, callbacks=[_callback(args)])
    return finish_worker(0)


# ------------------------------------------------------------------------------------------------ parent side
def _job(args: argparse.Namespace, mode: str, folder: Path) -> dict[str, float]:
    from megatron_bridge.utils.launch import reserved_port

    events = folder / "events.jsonl"
    env = {**os.environ, "OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // args.nproc)), "PYTHONUNBUFFERED": "1"}
    with reserved_port() as port:
        cmd = [sys.executable, "-m", "megatron_bridge.launcher.torchrun", f"--nproc_per_node={args.nproc}",
               "--master_addr=127.0.0.1", f"--master_port={port}", "--max_restarts=1", os.path.abspath(__file__),
               "--worker", mode, "--events", str(events), "--steps", str(args.steps), "--at", str(args.at),
               "--save_interval", str(args.save_interval), *args.overrides]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    ended = time.time()
    if proc.returncode != 0:
        raise SystemExit(f"the {mode} job failed (exit {proc.returncode}):\n{(proc.stdout + proc.stderr)[-4000:]}")
    rows = [json.loads(line) for line in events.read_text().splitlines()]
    at = {r["event"]: r["t"] for r in rows if r["event"] != "step"}
    needed = ("kill", "resumed", "first_step_after_restart") if mode == "restart" else ("signal", "saved")
    if any(name not in at for name in needed):
        raise SystemExit(f"the {mode} job did not record {needed}: {sorted(at)}\n{(proc.stdout + proc.stderr)[-4000:]}")
    steps = [r["seconds"] for r in rows if r["event"] == "step"]
    if mode == "restart":
        return {"restart_to_first_step_s": at["first_step_after_restart"] - at["kill"],
                "restart_to_resumed_s": at["resumed"] - at["kill"], "step_s": statistics.median(steps)}
    return {"preempt_to_saved_s": at["saved"] - at["signal"], "preempt_to_exit_s": ended - at["signal"],
            "step_s": statistics.median(steps)}


def main(argv: list[str] | None = None) -> int:
    """Run the rounds and print the medians."""
    args = parse_args(argv)
    if args.worker:
        return worker(args)
    if not 0 < args.at < args.steps or args.at <= args.save_interval:
        raise SystemExit(f"error: --at {args.at} needs --save_interval < --at < --steps (a checkpoint before the "
                         "failure, steps after it)")
    runs: dict[str, list[float]] = {}
    for r in range(args.rounds):
        for mode in ("restart", "preempt"):
            with tempfile.TemporaryDirectory(prefix=f"mb-{mode}-") as folder:
                for key, value in _job(args, mode, Path(folder)).items():
                    runs.setdefault(key, []).append(value)
        print(f"round {r + 1}/{args.rounds}: " + ", ".join(f"{k} {v[-1]:.2f}" for k, v in runs.items()), flush=True)
    labels = {
        "restart_to_first_step_s": f"restart: kill -9 at step {args.at} -> first step after the restart",
        "restart_to_resumed_s": "restart: kill -9 -> restarted workers resumed (set-up, checkpoint load done)",
        "preempt_to_saved_s": f"preemption: SIGUSR1 at step {args.at} -> checkpoint saved at the agreed step",
        "preempt_to_exit_s": "preemption: SIGUSR1 -> job ended",
        "step_s": "one training step (median)",
    }
    print(f"\n{args.nproc} gloo ranks, tiny recipe, {args.rounds} round(s), median seconds")
    print("| measurement | seconds |\n|---|---|")
    for key, label in labels.items():
        print(f"| {label} | {statistics.median(runs[key]):.2f} |")
    return 0


if __name__ == "__main__":
    from megatron_bridge.utils.cli import run_cli

    sys.exit(run_cli(main))
