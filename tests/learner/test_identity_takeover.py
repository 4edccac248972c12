"""A restarted learner with the same stable identity takes its predecessor's claims over at once (no wait for
the lease), and a predecessor that is in fact still alive can then commit none of them: no batch is trained
into a published version by two learners."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from sapwood.learner.audit import audit_training
from sapwood.learner.claims import BatchSource
from sapwood.learner.config import CriticConfig, LearnerConfig, SourceConfig
from sapwood.learner.loop import Learner
from sapwood.learner.model import TinyActorCritic, TinyTransformerConfig, TorchBackend
from sapwood.learner.trainer import SAOTrainer
from sapwood.platform import runs
from sapwood.platform.storage.learner_reads import policy_history
from sapwood.platform.store import Store
from tests.support.histories import small_execution
from tests.support.replay_store import replay_store

HOUR = 3600.0  # a lease no test waits out


@pytest.fixture(params=["postgresql", "sqlite"])
def any_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    url = request.getfixturevalue("pg_url") if request.param == "postgresql" else f"sqlite:///{tmp_path / 'c.db'}"
    store = Store.open(url)
    for seed in range(6):
        store.apply(small_execution(seed, calls=4, forks=1, segments=2).events)
    with store.transaction() as conn:
        runs.create_run(conn, "run", runs.ExecutionFilter(run_id="synthetic"))
    yield store
    store.close()


def _source(store: Store, identity: str) -> BatchSource:
    return BatchSource(store, "run", identity=identity, config=SourceConfig(executions_per_batch=2, lease_s=HOUR))


def test_a_restart_of_the_same_identity_takes_the_claims_over_at_once_and_the_predecessor_commits_none(
        any_store: Store) -> None:
    first = _source(any_store, "L0")
    held = first.next_batch()
    assert held is not None
    other = _source(any_store, "L1")  # another identity: takes nothing over, gets other executions
    assert other.taken_over == 0
    theirs = other.next_batch()
    assert theirs is not None
    assert not set(theirs.execution_ids) & set(held.execution_ids)

    restart = _source(any_store, "L0")  # the predecessor's lease has an hour left
    assert restart.learner_id != first.learner_id
    assert restart.taken_over == 2
    again = restart.next_batch()
    assert again is not None
    assert sorted(again.execution_ids) == sorted(held.execution_ids)  # no wait for the lease
    # the predecessor, were it still alive, lost them: its renew fails and its complete marks nothing
    assert held.renew() is False
    assert sorted(held.complete()) == sorted(held.execution_ids)
    assert again.complete() == []
    assert theirs.renew() is True  # the other identity's claims were left alone
    assert theirs.complete() == []
    with any_store.transaction() as conn:
        assert runs.run_progress(conn, "run") == {"pending": 2, "claimed": 0, "done": 4}


def test_an_identity_is_matched_whole_not_as_a_prefix_or_a_pattern(any_store: Store) -> None:
    for identity in ("L1", "L_", "L%"):
        assert _source(any_store, identity).next_batch() is not None
    assert _source(any_store, "L").taken_over == 0  # "L#" is no prefix of "L1#…", and "_" / "%" are literal
    with any_store.transaction() as conn:
        assert runs.run_progress(conn, "run") == {"pending": 0, "claimed": 6, "done": 0}


def _learner(store: Store, ckpt: Path, identity: str) -> Learner:
    torch.manual_seed(0)
    backend = TorchBackend(TinyActorCritic(TinyTransformerConfig(vocab_size=500)))
    trainer = SAOTrainer(backend, LearnerConfig(critic=CriticConfig(warmup_steps=0)))
    return Learner(store, "train", trainer, identity=identity, checkpoint_dir=ckpt, checkpoint_grace_s=0.0,
                   source_config=SourceConfig(executions_per_batch=1, lease_s=HOUR))


def test_two_live_learners_of_one_identity_never_both_publish_a_batch(tmp_path: Path) -> None:
    _, store, _ = replay_store(tmp_path / "s.db", 3)
    old = _learner(store, tmp_path / "ck", "L0")
    claimed = old.source.next_batch()
    assert claimed is not None
    new: list[Learner] = []
    original = old.trainer.train_step

    def step_while_a_restart_takes_over(batch):  # type: ignore[no-untyped-def]
        metrics = original(batch)
        # the old process is still alive mid-step when its "restart" starts and trains the same execution
        new.append(_learner(store, tmp_path / "ck", "L0"))
        assert new[0].source.taken_over == 1
        assert new[0].step() is not None  # version 1, on the old process's execution
        return metrics

    old.trainer.train_step = step_while_a_restart_takes_over  # type: ignore[method-assign]
    assert old.train(claimed) is None  # its commit found the claim gone: rolled back, reloaded version 1
    assert old.lost_claims == 1
    assert old.backend.policy_version == 1
    old.trainer.train_step = original  # type: ignore[method-assign]
    old.run(idle_timeout_s=0.0)
    new[0].resume()
    new[0].run(idle_timeout_s=0.0)
    audit = audit_training(store, "train")
    assert audit.ok, audit
    assert audit.trained == 3, audit
    with store.transaction() as conn:
        history = policy_history(conn, "train")
    published = Counter(e for _, _, meta in history for e in meta["execution_ids"])
    assert published[claimed.execution_ids[0]] == 1
    assert sorted(published.values()) == [1, 1, 1]
