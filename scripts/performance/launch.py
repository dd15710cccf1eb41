#!/usr/bin/env python3
"""Performance runs in the style of Megatron-Bridge's launcher.

    python scripts/performance/launch.py -m llama -mr llama3_8b -g h100 -ng 8 -c bf16   # Megatron-Bridge's command
    python scripts/performance/launch.py -mr llama3_8b -ng 8 --use_megatron_fsdp true
    python scripts/performance/launch.py --recipe tiny_llama -ng 2 -ms 20          # on a CPU, gloo
    python scripts/performance/launch.py --use_megatron_fsdp true                   # llama3_8b, -ng 2 (CP=2), on GPUs
    python scripts/performance/launch.py --use_megatron_fsdp true --dryrun          # the final YAML + memory estimate
    python scripts/performance/launch.py --compare runA/results.json runB/results.json
    python scripts/performance/launch.py -mr tiny_llama -ng 2 -gn 1 -a ACCOUNT -p PARTITION --detach false  # Slurm
    python scripts/performance/launch.py --status runs/perf/RUN     # a Slurm run's jobs and checkpoint step
    python scripts/performance/launch.py --follow runs/perf/RUN     # follow a detached Slurm run

Precedence (Megatron-Bridge's): recipe < per-GPU perf config (-g) < benchmark defaults < trailing key=value overrides
< flags; the flags are defined and applied in src/megatron_bridge/perf/args.py. See docs/performance.md.
"""

import json
import os
import sys
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    """Entry point: parse, build the config, dry-run / compare / launch / train."""
    from megatron_bridge.perf.args import build_config, build_parser, environment, recipe_name
    from megatron_bridge.perf.results import compare

    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser()
    args = parser.parse_intermixed_args(argv)  # flags anywhere, also between the key=value overrides
    if args.compare:
        from megatron_bridge.perf.results import read_results

        a, b = (read_results(p) for p in args.compare)
        print(compare(a, b))
        return 0
    if args.status is not None or args.follow is not None:
        return slurm_run_folder(args)
    if args.output_dir is not None:
        from megatron_bridge.utils.paths import check_output_path

        check_output_path(args.output_dir, "--output_dir")
    from megatron_bridge.launcher import slurm

    if slurm.requested(args):  # before the node flags: the Slurm job sets the nodes itself
        return slurm_run(args, argv)
    slurm.refuse_slurm_flags(args, parser)
    from megatron_bridge.launcher.nodes import node_layout, processes_per_node
    from megatron_bridge.perf.world import check_machine, check_world_size, resolve_defaults, this_machine

    layout = node_layout(args)  # a job over nodes started by hand (or another scheduler): this node's share
    machine = None if args.dryrun else this_machine()
    said = resolve_defaults(args, machine)  # no -ng (no -mr without GPUs): what this machine runs
    if said:
        print(("# " if args.dryrun else "") + said, flush=True)  # a dry run prints YAML: a comment there
    nproc = processes_per_node(args.num_gpus, args.gpus_per_node, layout.nnodes)
    cfg = build_config(args)
    check_world_size(cfg, args.num_gpus)
    if machine is not None:
        check_machine(cfg, machine)
    env = environment(args, cfg)
    for key, value in env.items():  # the perf config's process environment (Megatron-Bridge's env_vars)
        os.environ.setdefault(key, value)
    if args.dryrun:
        from megatron_bridge.perf.estimate import dry_run_report

        cfg.validate(world_size=args.num_gpus)
        print(cfg.to_yaml(), end="")
        print("".join(f"# env {key}={os.environ[key]}\n" for key in env), end="")
        print(dry_run_report(cfg, args.num_gpus, args.gpu), end="")
        return 0
    from megatron_bridge.launcher.local import relaunch_with_torchrun
    from megatron_bridge.utils.launch import running_under_torchrun

    output_dir = args.output_dir or default_output_dir(args)
    if layout.needs_launcher(nproc) and not running_under_torchrun():
        chosen = ["-mr", recipe_name(args), "-ng", str(args.num_gpus)]  # the workers run what was chosen here
        return relaunch_with_torchrun(nproc, [os.path.abspath(__file__), *argv, *chosen, "--output_dir", output_dir],
                                      layout=layout)
    return run(cfg, output_dir)


def slurm_run(args, argv: list[str]) -> int:  # noqa: ANN001
    """-a/-p: write the sbatch script into the run folder and submit it (a node of the job: train); -d prints it."""
    from megatron_bridge.launcher import slurm
    from megatron_bridge.utils.launch import running_under_torchrun

    if running_under_torchrun():  # a worker of the job: a stop signal from now on is remembered, never lost
        from megatron_bridge.training import stop_signals

        stop_signals.catch(stop_signals.SCHEDULER_STOP_SIGNALS)
    from megatron_bridge.perf.args import build_config, environment
    from megatron_bridge.perf.world import check_world_size, resolve_defaults

    said = resolve_defaults(args, None)  # no -ng: the layout's smallest world size (the job's nodes are not here)
    if said and not running_under_torchrun():
        print(said, file=sys.stderr, flush=True)  # stdout may be the sbatch script (-d)
    cfg = build_config(args)
    check_world_size(cfg, args.num_gpus)
    env = environment(args, cfg)
    run_dir = Path(args.output_dir or default_output_dir(args)).resolve()
    options = slurm.options_from_args(args, env)
    slurm.prepare_config(cfg, run_dir, options)
    if running_under_torchrun():  # a worker on one of the job's nodes
        for key, value in env.items():
            os.environ.setdefault(key, value)
        return run(cfg, str(run_dir))
    cfg.validate(world_size=args.num_gpus)
    job = slurm.SlurmJob(options=options, run_dir=run_dir, job_name=f"mb-{run_dir.name}",
                         command=(os.path.abspath(__file__), *(a for a in argv if a not in ("-d", "--dryrun")),
                                  "--output_dir", str(run_dir)),
                         python="python" if args.container_image else sys.executable, workdir=Path.cwd(),
                         train_iters=cfg.train_iters, checkpoint_dir=cfg.checkpoint.save,
                         exit_signal=cfg.train.exit_signal)
    script = slurm.render_script(job)
    if args.dryrun:
        print(script, end="")
        return 0
    slurm.require_sbatch()
    from megatron_bridge.launcher.slurm_run_dir import submission

    with submission(run_dir):  # one live job per run folder: a live one is refused before anything is written
        job_id = slurm.submit(slurm.write_script(job, script))
        (run_dir / slurm.JOBS_FILE).write_text(f"{job_id}\n")
    print(f"submitted Slurm job {job_id}; run folder {run_dir}, log {run_dir / f'slurm-{job_id}.out'}", flush=True)
    if args.detach:
        return 0
    return follow_run(run_dir, job_id)


def follow_run(run_dir: Path, job_id: str) -> int:
    """Follow the run from ``job_id`` (its logs hold the SUMMARY line); the results' path at the end."""
    from megatron_bridge.launcher.slurm_follow import follow

    code = follow(run_dir, job_id)
    results = run_dir / "results.json"
    if code == 0 and results.exists():
        print(f"results: {results}")
    return code


def slurm_run_folder(args) -> int:  # noqa: ANN001
    """--status RUN_DIR: report a Slurm run; --follow RUN_DIR: follow it (from its first job that has not ended)."""
    from megatron_bridge.launcher import slurm, slurm_run_dir

    slurm.require_sbatch()
    if args.status is not None:
        print("\n".join(slurm_run_dir.status_report(args.status.resolve())))
        return 0
    run_dir = args.follow.resolve()
    return follow_run(run_dir, slurm_run_dir.job_to_follow(run_dir))


def default_output_dir(args) -> str:  # noqa: ANN001
    """runs/perf/<recipe>-<date>-<time>."""
    from megatron_bridge.perf.args import recipe_name

    return f"runs/perf/{recipe_name(args)}-{time.strftime('%Y%m%d-%H%M%S')}"


def run(cfg, output_dir: str) -> int:  # noqa: ANN001
    """Train and write results (rank 0)."""
    import torch

    from megatron_bridge.perf.results import build_results, join_slices, summary_line, write_results
    from megatron_bridge.training.pretrain import pretrain

    result = pretrain(cfg)
    if int(os.environ.get("RANK", "0")) == 0:
        device = torch.cuda.get_device_name() if torch.cuda.is_available() else None
        results = build_results(cfg, result, device_name=device)
        earlier = Path(output_dir) / "results.json"
        if earlier.exists():  # a resumed run (e.g. the next Slurm job): the earlier steps' entries stay
            results = join_slices(json.loads(earlier.read_text()), results)
        json_path, plot_path = write_results(results, output_dir)
        print(f"results: {json_path}" + (f", plot: {plot_path}" if plot_path else ""))
        print(summary_line(results))
    from megatron_bridge.utils.launch import finish_worker

    return finish_worker(0)


if __name__ == "__main__":
    from megatron_bridge.utils.cli import run_cli

    sys.exit(run_cli(main))
