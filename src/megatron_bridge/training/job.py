"""What the workers of one job agree on when ``pretrain()`` starts (the same resolved config, whether this is a
restarted attempt), and what a worker tells the launcher when it fails (whether a restart would help).

* **Config digest.** Every rank hashes its validated config's YAML (:func:`config_digest`); one ``all_gather``
  compares them. A node started with other overrides, another YAML file or another version of a data file path is
  refused with :class:`ConfigMismatchError` naming the nodes and ranks that differ from rank 0, before any model is
  built (a silent mismatch would train different models on different ranks, or hang in a collective).
* **Restarted attempt.** torch's agent counts restarts per node (``TORCHELASTIC_RESTART_COUNT``: a node whose workers
  did not fail may still read 0), so the attempt number is the maximum over all ranks. A restarted attempt resumes
  from the job's own checkpoints: when ``checkpoint.load`` is unset it loads from ``checkpoint.save`` (logged); the
  first attempt never does, so a fresh job does not pick up another run's checkpoints.
* **No restart for errors a restart repeats.** A worker that fails with a project error (a bad config value, a
  corrupt file, a NaN loss: exit code 2) writes :data:`NO_RESTART_KEY` into the job's rendezvous store (the agent
  store at ``MASTER_ADDR:MASTER_PORT``) before it aborts its process groups (:func:`forbid_restart_after`), so every
  node's launcher (:mod:`megatron_bridge.launcher.restart`) finds it by the time its own workers fail because of it.
"""

import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from megatron_bridge.config.serialization import config_digest
from megatron_bridge.errors import LaunchError
from megatron_bridge.utils.logging import get_logger, log_rank_0


logger = get_logger(__name__)

NO_RESTART_KEY = "megatron_bridge/no_restart"
"""Key of the rendezvous store holding the reason a job must not be restarted."""
STORE_TIMEOUT_S = 5
"""Seconds to reach the rendezvous store when marking or reading the key."""


class ConfigMismatchError(LaunchError):
    """The nodes (ranks) of one job resolved different configs."""


@dataclass(frozen=True)
class RankFacts:
    """What each rank contributes to the start-of-job agreement."""

    digest: str
    """SHA-256 of the validated config's YAML."""
    node: int
    """torch's ``GROUP_RANK`` (the node index; 0 outside torchrun)."""
    host: str
    """Host name."""
    attempt: int
    """torch's ``TORCHELASTIC_RESTART_COUNT`` on this node."""
    values: dict[str, str] | None = None
    """The config's leaves (``train.train_iters`` -> ``'10'``), to name the first key that differs."""


def _my_facts(cfg: Any) -> RankFacts:
    import socket

    return RankFacts(config_digest(cfg), int(os.environ.get("GROUP_RANK", "0")), socket.gethostname(),
                     int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")), config_leaves(cfg))


def config_leaves(cfg: Any) -> dict[str, str]:
    """Every leaf of the config as ``dotted.key -> repr(value)``, in declaration order."""
    from megatron_bridge.config.serialization import to_dict

    leaves: dict[str, str] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict) and value:
            for key, item in value.items():
                walk(f"{prefix}.{key}" if prefix else str(key), item)
        else:
            leaves[prefix] = repr(value)

    walk("", to_dict(cfg))
    return leaves


def first_difference(a: dict[str, str] | None, b: dict[str, str] | None) -> str:
    """``; first difference: train.train_iters = 10 on rank 0, 20 there`` ("" when unknown or none)."""
    if a is None or b is None:
        return ""
    for key in [*a, *(k for k in b if k not in a)]:
        if a.get(key) != b.get(key):
            mine, theirs = a.get(key, "(absent)"), b.get(key, "(absent)")
            return f"; first difference: {key} = {mine} on rank 0, {theirs} there"
    return ""


def check_same_config(facts: list[RankFacts]) -> None:
    """Raise :class:`ConfigMismatchError` unless every rank's digest equals rank 0's."""
    reference = facts[0].digest
    differ = [rank for rank, f in enumerate(facts) if f.digest != reference]
    if not differ:
        return
    nodes = sorted({facts[r].node for r in differ})
    where = ", ".join(f"node {n} ({facts[next(r for r in differ if facts[r].node == n)].host}: ranks "
                      f"{[r for r in differ if facts[r].node == n]})" for n in nodes)
    raise ConfigMismatchError(
        f"the resolved config differs between the nodes of this job: {where} differ from rank 0 on node "
        f"{facts[0].node} (config digest {facts[r := differ[0]].digest[:12]} vs {reference[:12]}"
        f"{first_difference(facts[0].values, facts[r].values)}). Every node must "
        "run the same command with the same recipe, --config-file contents and key=value overrides; compare "
        f"`--dry-run` output on node {facts[r].node} and node {facts[0].node}")


def restarted_attempt(facts: list[RankFacts]) -> int:
    """The job's attempt number (0: first), the maximum over the ranks' per-node restart counts."""
    return max(f.attempt for f in facts)


def agree_on_job(cfg: Any) -> int:
    """Gather every rank's :class:`RankFacts`, refuse a config mismatch, and return the attempt number; on a restarted
    attempt with ``checkpoint.load`` unset, point it at ``checkpoint.save`` (the job's own checkpoints)."""
    import torch.distributed as dist

    facts = [_my_facts(cfg)]
    if dist.is_initialized() and dist.get_world_size() > 1:
        gathered: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, facts[0])
        facts = gathered
    check_same_config(facts)
    attempt = restarted_attempt(facts)
    if attempt > 0:
        c = cfg.checkpoint
        if c.load is None and c.save is not None:
            c.load = c.save
            log_rank_0(logger, "restarted attempt %d: checkpoint.load was unset, resuming from this job's "
                       "checkpoint.save=%s", attempt, c.save)
    return attempt


def log_resume(attempt: int, step: int, loaded: bool) -> None:
    """One line on a restarted attempt: from which step it goes on."""
    if attempt == 0:
        return
    if loaded:
        log_rank_0(logger, "restarted attempt %d: restarted from step %d (the last complete checkpoint)", attempt, step)
    else:
        log_rank_0(logger, "restarted attempt %d: no checkpoint yet, restarted from step 0", attempt)


def rendezvous_store(host: str, port: int) -> Any:
    """A client of the job's rendezvous store (torch's agent hosts it on node 0)."""
    from torch.distributed import TCPStore

    return TCPStore(host, port, is_master=False, timeout=timedelta(seconds=STORE_TIMEOUT_S))


def forbid_restart(reason: str) -> None:
    """From a worker under torchrun with a restart budget: tell every node's launcher not to restart the job (the
    reason is kept in the rendezvous store). Does nothing outside such a job; never raises."""
    if int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0") or 0) <= 0 or "MASTER_ADDR" not in os.environ:
        return
    try:
        rendezvous_store(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])).set(NO_RESTART_KEY, reason[:500])
    except Exception as exc:  # noqa: BLE001  (the original error matters more than this note)
        logger.warning("could not mark the job as not restartable in the rendezvous store: %s", exc)


def forbid_restart_after(exc: BaseException) -> None:
    """:func:`forbid_restart` when ``exc`` is an error a restart repeats (one the command line ends with code 2)."""
    from megatron_bridge.utils.cli import EXIT_USER_ERROR, describe

    message, code = describe(exc)
    if code == EXIT_USER_ERROR:
        forbid_restart(message)
