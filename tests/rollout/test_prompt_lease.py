"""``PromptLease.wait_stored``: a worker holds its sample until the finished execution is in the store."""

from __future__ import annotations

from pathlib import Path

from sapwood.platform import runs
from sapwood.platform.prompts import PromptRow, add_prompts
from sapwood.platform.store import Store
from sapwood.rollout import InProcessTransport, Recorder
from sapwood.rollout.prompts import PromptClient


def test_wait_stored_is_false_until_the_finish_is_stored_then_true(tmp_path: Path) -> None:
    store = Store.open(f"sqlite:///{tmp_path / 's.db'}")
    with store.transaction() as conn:
        runs.create_run(conn, "p", runs.ExecutionFilter(run_id="p"), kind="live")
        add_prompts(conn, "p", [PromptRow("q", "t", "f", {})], samples_per_prompt=1)
    client = PromptClient(store, "p", worker_id="w", lease_s=60.0)
    with Recorder(InProcessTransport(store, batch_size=1), run_id="p", vocab_size=100) as rec:
        lease = rec.claim_prompt(client)
        assert lease is not None
        ex = lease.start()
        ex.prompt([1, 2, 3])
        rec.flush()
        assert lease.wait_stored(0.0) is False, "started, not finished: not done"
        assert not client.done(lease.sample.sample_id)
        ex.finish("success", reward=1.0)
        rec.flush()
        assert lease.wait_stored(5.0) is True
    assert client.claim() is None, "done: nothing left to claim"
    store.close()
