"""A torchrun worker for the fail-fast and no-orphan tests: trains the small pretrain config, misbehaving as
``$MB_FAIL_MODE`` says, through the same ``run_cli`` ending as the project's scripts.

Modes: ``raise`` (rank 1's forward step raises at step 2), ``hang`` (rank 1's forward step sleeps far beyond the
collective timeout at step 2), or ``user_error`` (rank 1 raises a DataError at step 2).
"""

import os
import sys
import time
from pathlib import Path


HANG_TIMEOUT_S = 20
"""dist.distributed_timeout_seconds of the "hang" mode."""


def _mode_step(mode: str):  # noqa: ANN202
    from megatron_bridge.errors import DataError
    from megatron_bridge.training.gpt_step import forward_step

    rank = int(os.environ["RANK"])

    def step(state, data_iterator, model):  # noqa: ANN001, ANN202
        if rank == 1 and state.train_state.step == 1:
            if mode == "raise":
                raise RuntimeError(f"boom-on-rank-{rank}: the forward step failed")
            if mode == "user_error":
                raise DataError(f"bad-sample-on-rank-{rank}: a user-fixable data problem")
            if mode == "hang":
                time.sleep(600)
        return forward_step(data_iterator, model)

    return step


def main(argv: list[str]) -> int:
    """Train; the forward step misbehaves per ``$MB_FAIL_MODE``."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
    from megatron_bridge.training.pretrain import pretrain
    from tests.functional_tests.training._common import small_config

    mode = os.environ["MB_FAIL_MODE"]
    cfg = small_config(train_iters=8)
    if mode == "hang":  # long enough for a slow start of one rank on a loaded machine, short for a test
        cfg.dist.distributed_timeout_seconds = HANG_TIMEOUT_S
    cfg.logger.tensorboard_dir = None
    pretrain(cfg, _mode_step(mode))
    return 0


if __name__ == "__main__":
    from megatron_bridge.utils.cli import run_cli

    sys.exit(run_cli(main))
