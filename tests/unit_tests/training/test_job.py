"""What the ranks of a job agree on at the start: the config digest and the restarted attempt."""

import pytest

from megatron_bridge.recipes import tiny_llama_pretrain_config
from megatron_bridge.training.job import (
    ConfigMismatchError,
    RankFacts,
    agree_on_job,
    check_same_config,
    config_digest,
    config_leaves,
    restarted_attempt,
)


def _facts(*digests_nodes: tuple[str, int], attempt: int = 0) -> list[RankFacts]:
    return [RankFacts(d, n, f"host{n}", attempt) for d, n in digests_nodes]


def test_digest_follows_the_resolved_config() -> None:
    a, b = tiny_llama_pretrain_config(), tiny_llama_pretrain_config()
    assert config_digest(a) == config_digest(b)
    b.train.manual_gc = True
    assert config_digest(a) != config_digest(b)


def test_same_digests_pass() -> None:
    check_same_config(_facts(("x", 0), ("x", 0), ("x", 1), ("x", 1)))


def test_a_node_with_another_config_is_named() -> None:
    with pytest.raises(ConfigMismatchError, match=r"node 1 \(host1: ranks \[2, 3\]\) differ from rank 0 on node 0"):
        check_same_config(_facts(("x", 0), ("x", 0), ("y", 1), ("y", 1)))


def test_restarted_attempt_is_the_maximum_over_nodes() -> None:
    facts = [RankFacts("x", 0, "h", 1), RankFacts("x", 1, "h", 0)]
    assert restarted_attempt(facts) == 1


def test_a_restarted_attempt_resumes_from_its_save_folder(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:  # noqa: ANN001
    cfg = tiny_llama_pretrain_config()
    cfg.checkpoint.save, cfg.checkpoint.load = str(tmp_path), None
    assert agree_on_job(cfg) == 0 and cfg.checkpoint.load is None  # a first attempt never picks up old checkpoints
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    assert agree_on_job(cfg) == 1 and cfg.checkpoint.load == str(tmp_path)


def test_a_mismatch_names_the_first_differing_key_and_both_values() -> None:
    a, b = tiny_llama_pretrain_config(), tiny_llama_pretrain_config()
    b.train.train_iters = a.train.train_iters + 7
    facts = [RankFacts(config_digest(a), 0, "host0", 0, config_leaves(a)),
             RankFacts(config_digest(b), 1, "host1", 0, config_leaves(b))]
    with pytest.raises(ConfigMismatchError) as info:
        check_same_config(facts)
    assert (f"first difference: train.train_iters = {a.train.train_iters} on rank 0, {b.train.train_iters} there"
            in str(info.value))
