"""A torchrun worker for the multi-node, restart and preemption tests: trains ``small_config`` (10 steps, checkpoints
every 5 into ``$MB_RUN_DIR/checkpoints``) through the same ``run_cli`` ending as the project's scripts, and records
each attempt's per-step losses (rank 0) in ``$MB_RUN_DIR/losses.jsonl``.

Environment:
* ``MB_FAULT=kill:RANK:STEP``: that rank sends itself SIGKILL in the forward step of step STEP, first attempt only.
* ``MB_FAULT=user_error:RANK:STEP``: that rank raises a DataError there (a project error: exit code 2), every attempt.
* ``MB_STEP_SLEEP=S``: every forward step sleeps S seconds (a window for the signal tests; losses unchanged).
* ``MB_EXIT_SIGNAL=SIGTERM|SIGUSR1``: ``train.exit_signal_handler`` on that signal.
* ``MB_RESUME=1``: ``checkpoint.load`` = ``checkpoint.save`` (a new start resumes; without it only a restarted
  attempt does).
"""

import json
import os
import signal
import sys
import time
from pathlib import Path


TRAIN_ITERS = 10
SAVE_INTERVAL = 5


def _step(fault: str, sleep_s: float):  # noqa: ANN202
    from megatron_bridge.errors import DataError
    from megatron_bridge.training.gpt_step import forward_step

    rank, attempt = int(os.environ["RANK"]), int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    kind, fault_rank, fault_step = (fault.split(":") + ["", "-1", "-1"])[:3] if fault else ("", "-1", "-1")

    def step(state, data_iterator, model):  # noqa: ANN001, ANN202
        if rank == int(fault_rank) and state.train_state.step + 1 == int(fault_step):
            if kind == "kill" and attempt == 0:
                os.kill(os.getpid(), signal.SIGKILL)
            if kind == "user_error":
                raise DataError(f"bad-sample-on-rank-{rank}: a user-fixable data problem")
        if sleep_s:
            time.sleep(sleep_s)
        return forward_step(data_iterator, model)

    return step


def main(argv: list[str]) -> int:
    """Train; misbehave per ``$MB_FAULT``; append this attempt's losses to ``$MB_RUN_DIR/losses.jsonl``."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
    from megatron_bridge.training.pretrain import pretrain
    from tests.functional_tests.training._common import small_config

    run_dir = Path(os.environ["MB_RUN_DIR"])
    cfg = small_config(train_iters=TRAIN_ITERS)
    cfg.checkpoint.save = str(run_dir / "checkpoints")
    cfg.checkpoint.save_interval = SAVE_INTERVAL
    if os.environ.get("MB_RESUME"):
        cfg.checkpoint.load = cfg.checkpoint.save
    cfg.logger.tensorboard_dir = None
    cfg.logger.log_interval = 1
    if os.environ.get("MB_EXIT_SIGNAL"):
        cfg.train.exit_signal_handler, cfg.train.exit_signal = True, os.environ["MB_EXIT_SIGNAL"]
    result = pretrain(cfg, _step(os.environ.get("MB_FAULT", ""), float(os.environ.get("MB_STEP_SLEEP", "0"))))
    if int(os.environ.get("RANK", "0")) == 0:
        with (run_dir / "losses.jsonl").open("a") as f:
            f.write(json.dumps({"steps": result.steps, "losses": result.losses, "exit_reason": result.exit_reason,
                                "attempt": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))}) + "\n")
    return 0


if __name__ == "__main__":
    from megatron_bridge.utils.cli import run_cli

    sys.exit(run_cli(main))
