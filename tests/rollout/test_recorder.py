"""The TITO recorder: tree tracking, input encoding, chunking and misuse errors (no servers)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from sapwood.platform.codec import encode
from sapwood.platform.errors import (
    DTypeError,
    LengthMismatchError,
    SequenceError,
    UnknownParentError,
    ValidationError,
)
from sapwood.platform.events import Event, ModelCall, Prompt
from sapwood.platform.store import Store
from sapwood.platform.tokens import input_digest
from sapwood.rollout import (
    DeliveryError,
    EventTooLargeError,
    InProcessTransport,
    MemoryTransport,
    Recorder,
    TransportError,
)

rng = np.random.default_rng(7)


def toks(n: int) -> np.ndarray:
    return rng.integers(0, 1000, n, dtype=np.int32)


def lps(n: int) -> np.ndarray:
    return -rng.random(n).astype(np.float32)


def memory_recorder(**kw: object) -> tuple[Recorder, MemoryTransport]:
    transport = MemoryTransport()
    return Recorder(transport, run_id="r", vocab_size=1000, **kw), transport  # type: ignore[arg-type]


def calls(transport: MemoryTransport) -> list[ModelCall]:
    return [e for e in transport.events if isinstance(e, ModelCall)]


def test_input_sent_as_parent_plus_appended_with_full_digest() -> None:
    rec, transport = memory_recorder()
    ex = rec.start("t", prompt=toks(50))
    ctx = ex.context()
    out = toks(10)
    first = ex.call(np.concatenate([ctx, toks(2)]), out, lps(10))
    obs = toks(20)
    ex.observe(obs)
    second_in = np.concatenate([ctx, first.appended, out, obs, toks(2)])
    second = ex.call(second_in, toks(5), lps(5))
    assert first.parent is not None
    assert first.appended.size == 2
    assert second.parent == ex.writer.nodes[ex.writer.nodes[second.output_node_id].parent or ""].parent
    assert second.appended.size == 2, "only the new tokens travel"
    assert second.input_digest == input_digest(second_in)
    assert [e.seq for e in transport.events] == list(range(len(transport.events)))


def test_input_extending_no_node_goes_as_full_tokens() -> None:
    rec, _ = memory_recorder()
    ex = rec.start("t", prompt=toks(30))
    fresh = toks(25)
    call = ex.call(fresh, toks(3), lps(3))
    assert call.parent is None
    assert np.array_equal(call.appended, fresh)
    assert call.input_digest == input_digest(fresh)


def test_rerendered_input_shares_whole_nodes_only() -> None:
    rec, _ = memory_recorder()
    ex = rec.start("t", prompt=toks(30))
    ctx = np.concatenate([ex.context(), toks(2)])
    out = toks(8)
    call = ex.call(ctx, out, lps(8))
    ex.observe(toks(10))
    full = ex.context()
    rerendered = np.concatenate([full[:-1], toks(4)])  # last observation token differs
    again = ex.call(rerendered, toks(3), lps(3))
    assert again.parent == call.output_node_id
    assert again.appended.size == 9 - 0 + 4  # the observation minus its last token, plus 4
    assert again.input_digest == input_digest(rerendered)


def test_explicit_after_must_prefix_the_input() -> None:
    rec, _ = memory_recorder()
    ex = rec.start("t", prompt=toks(10))
    root = ex.head
    ex.call(np.concatenate([ex.context(), toks(1)]), toks(2), lps(2))
    with pytest.raises(ValidationError, match="do not start with the context"):
        ex.call(toks(12), toks(2), lps(2), after=root)
    pinned = ex.call(np.concatenate([ex.context(root), toks(3)]), toks(2), lps(2), after=root)
    assert pinned.parent == root


def test_fork_compaction_and_segments_round_trip_through_the_store(tmp_path: Path) -> None:
    store = Store.open(f"sqlite:///{tmp_path / 's.db'}")
    rec = Recorder(InProcessTransport(store, batch_size=4), run_id="r", vocab_size=1000)
    inputs: dict[str, np.ndarray] = {}
    with rec.start("t", prompt=toks(40)) as ex:
        ctx = ex.context()
        for turn in range(6):
            inp = np.concatenate([ctx, toks(2)])
            kind = "summary" if turn == 3 else "action"
            out = toks(6)
            c = ex.call(inp, out, lps(6), kind=kind, policy_version=turn)
            inputs[c.call_id] = inp
            if kind == "summary":
                ex.compact(np.concatenate([toks(5), out]))
                ctx = ex.context()
                continue
            ex.observe(toks(7))
            ctx = ex.context()
            if turn == 1:
                ex.fork(3)
                branch_in = np.concatenate([ctx, toks(1)])
                b = ex.call(branch_in, toks(4), lps(4))
                inputs[b.call_id] = branch_in
        ex.score(0.5)
        ex.finish("timeout", reward=0.5)
    rec.close()
    for call_id, inp in inputs.items():
        assert np.array_equal(store.reconstruct_input(call_id), inp)
    s = store.stats()
    assert s["compactions"] == 1
    assert s["fork_points"] == 1
    assert s["executions"] == {"timeout": 1}
    store.close()


def test_misuse_raises_before_anything_is_sent() -> None:
    rec, transport = memory_recorder()
    ex = rec.start("t", prompt=toks(5))
    sent = len(transport.events)
    with pytest.raises(LengthMismatchError, match="log-prob"):
        ex.call(np.concatenate([ex.context(), toks(1)]), toks(4), lps(3))
    with pytest.raises(DTypeError):
        ex.call(np.concatenate([ex.context(), toks(1)]), toks(2), np.array([0.5, -1.0], dtype=np.float32))
    with pytest.raises(ValidationError, match="call_kind"):
        ex.call(np.concatenate([ex.context(), toks(1)]), toks(2), lps(2), kind="thought")
    with pytest.raises(UnknownParentError):
        ex.fork(2, at="00000000-0000-0000-0000-000000000000")
    with pytest.raises(SequenceError, match="summary"):
        ex.compact(toks(3))
    with pytest.raises(ValidationError):
        ex.observe([])
    assert len(transport.events) == sent, "a refused record must not consume a sequence number"
    ok = ex.call(np.concatenate([ex.context(), toks(1)]), toks(2), lps(2))
    assert ok.seq == sent
    ex.finish("success", reward=1.0)
    with pytest.raises(SequenceError, match="finished"):
        ex.call(np.concatenate([ex.context(), toks(1)]), toks(2), lps(2))
    with pytest.raises(SequenceError):
        ex.finish("success")
    ex.score(0.9)  # partial scores may still revise a finished execution


def test_out_of_vocab_tokens_are_refused() -> None:
    rec, _ = memory_recorder()
    ex = rec.start("t", prompt=toks(5))
    with pytest.raises(ValidationError, match="vocab"):
        ex.observe([5, 1000])


def test_block_exit_finishes_with_error() -> None:
    rec, transport = memory_recorder()
    with pytest.raises(RuntimeError), rec.start("t", prompt=toks(5)):
        raise RuntimeError("engine crashed")
    last = transport.events[-1]
    assert last.kind == "execution_finished"
    assert last.status == "error"
    assert "engine crashed" in last.message  # type: ignore[attr-defined]


class LimitedTransport(MemoryTransport):
    max_event_bytes = 40_000


def test_long_inputs_are_split_into_chained_events(tmp_path: Path) -> None:
    transport = LimitedTransport()
    rec = Recorder(transport, run_id="r", vocab_size=1000)
    ex = rec.start("t", prompt=toks(25_000))
    big = np.concatenate([ex.context(), toks(30_000)])
    call = ex.call(big, toks(100), lps(100))
    ex.observe(toks(12_000))
    ex.finish("success", reward=0.0)
    assert all(len(encode(e)) <= LimitedTransport.max_event_bytes for e in transport.events)
    assert sum(isinstance(e, Prompt) for e in transport.events) >= 4
    store = Store.open(f"sqlite:///{tmp_path / 's.db'}")
    store.apply(transport.events)
    assert np.array_equal(store.reconstruct_input(call.call_id), big)
    with pytest.raises(EventTooLargeError):
        ex2 = rec.start("t2", prompt=toks(3))
        ex2.call(np.concatenate([ex2.context(), toks(1)]), toks(6000), lps(6000))
    store.close()


class FlakyTransport(MemoryTransport):
    """Fails delivery of every event of one execution."""

    def __init__(self) -> None:
        super().__init__()
        self.poisoned: str | None = None

    def send(self, event: Event) -> None:
        if event.execution_id == self.poisoned:
            self._delivered(event, OSError("broker gone"))
        else:
            super().send(event)
        self.raise_pending()


def test_delivery_failure_breaks_only_its_execution() -> None:
    transport = FlakyTransport()
    rec = Recorder(transport, run_id="r")
    a = rec.start("a", prompt=toks(3))
    b = rec.start("b", prompt=toks(3))
    transport.poisoned = a.execution_id
    with pytest.raises(TransportError, match="lost an event"):
        a.observe(toks(2))
    b.observe(toks(2))  # unaffected
    with pytest.raises(TransportError, match="lost an event"):
        a.observe(toks(2))
    assert rec.broken(b.execution_id) is None


def test_inprocess_transport_reports_rejected_events(tmp_path: Path) -> None:
    store = Store.open(f"sqlite:///{tmp_path / 's.db'}")
    ledger: list[tuple[str, BaseException | None]] = []
    transport = InProcessTransport(store, batch_size=100, on_delivery=lambda e, err: ledger.append((e.kind, err)))
    rec, good = memory_recorder()
    ex = rec.start("t", prompt=toks(5))
    call = ex.call(np.concatenate([ex.context(), toks(1)]), toks(2), lps(2))
    ex.finish("success", reward=1.0)
    call.input_digest = "0" * 32  # corrupted after recording
    for e in good.events:
        transport.send(e)
    with pytest.raises(DeliveryError, match="digest") as info:
        transport.flush()
    assert [err.reason for _, err in info.value.failures] == ["digest_mismatch", "sequence"]  # type: ignore[attr-defined]
    assert sum(err is None for _, err in ledger) == 2  # execution_started + prompt were applied
    assert store.stats()["events"] == 2
    transport.close()
    store.close()
