"""Child process of test_crash_safety: for each case, a forked process saves step 1, then pauses the save of step 2
at the case's stage (and is SIGKILLed there by the test).

Usage: ``python -m tests.unit_tests.checkpoint.crash_child CASE_DIR:STAGE:MODE ...`` (MODE "sync" or "async").
Each case writes the full weights of step N to ``CASE_DIR/ref_<N>.pt`` before saving step N, saves into
``CASE_DIR/ckpt`` and, when paused, writes ``"<stage> <pid>"`` to ``CASE_DIR/reached``. Imports happen once; the
cases are forked from this process (no process group or thread exists before the fork).
"""

import os
import sys
import warnings
from pathlib import Path

import torch

from megatron_bridge.checkpoint.files import PAUSE_ENV, PAUSE_MARKER_ENV
from tests.unit_tests.checkpoint.toy import build_run, full_weights, tiny_cfg, train


def run_case(case_dir: Path, stage: str, use_async: bool) -> None:
    """Save step 1, then save step 2 with the pause hook armed."""
    warnings.simplefilter("ignore")
    marker = case_dir / "reached"
    run = build_run(tiny_cfg(save=str(case_dir / "ckpt"), async_save=use_async))
    for step in (1, 2):
        train(run, 1)
        torch.save(full_weights(run), case_dir / f"ref_{step}.pt")
        if step == 2:
            os.environ[PAUSE_ENV] = stage
            os.environ[PAUSE_MARKER_ENV] = str(marker)
        run.manager.save()
        run.manager.close()  # async: waits for the background commit (forever once paused)
    marker.write_text("finished without pausing")


def _warm_up() -> None:
    """Do the lazy imports (torch._dynamo on first init, the DDP backend, DCP) once, before forking."""
    import megatron_bridge.distributed.ddp  # noqa: F401
    from megatron_bridge.models import build_model_chunks

    build_model_chunks(tiny_cfg().model, device="cpu")


def main() -> None:
    """Fork one process per case and wait for all of them."""
    _warm_up()
    pids = []
    for spec in sys.argv[1:]:
        case_dir, stage, mode = spec.rsplit(":", 2)
        pid = os.fork()
        if pid == 0:
            try:
                run_case(Path(case_dir), stage, mode == "async")
            finally:
                os._exit(0)
        pids.append(pid)
    for pid in pids:
        os.waitpid(pid, 0)


if __name__ == "__main__":
    main()
