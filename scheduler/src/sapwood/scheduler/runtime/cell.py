"""A cell: a capacity and a role (rollout | train | idle); one Ray actor per cell (:mod:`.cluster` makes it one).

In the rollout role the cell serves engine calls with the local torch engine
(:class:`~sapwood.rollout.torch_engine.LocalTorchEngine`: the learner's ``TinyActorCritic`` on CPU), at
most ``capacity`` at a time, decoding incrementally over a KV cache, token by token so that a call can
be aborted between two tokens. Each execution's KV stays on the cell between its calls
(:class:`~sapwood.scheduler.runtime.kv_store.KVStore`, keyed by the call's ``session``, LRU by bytes):
a next call whose input extends the cached tokens feeds only the new suffix. A draining cell refuses
new calls; an aborted call answers ``aborted`` with its partial output once released (or after
:data:`RELEASE_WAIT_S`), and its KV can be exported to
the target cell through Ray's object store (:meth:`Cell.export_kv` / :meth:`Cell.import_kv`) or
recomputed there (:meth:`Cell.prefill`). Agent loops and environments live in their own actors
(:mod:`~sapwood.demo.elastic.executions`).

Each cell has a device clock (:class:`~sapwood.scheduler.runtime.device_clock.DeviceClock`, costs in
``device_costs``; ``decode_delay_s`` alone sets ``decode_token_s``): every generated token does its real
computation and ends no earlier than its share of a batched decode step on the cell's clock (× the
call's ``decode_scale``), so a busy cell cannot borrow an idle cell's CPU (0 costs in production).
:meth:`Cell.pause` holds every call in flight once it has generated ``after_tokens``
tokens (SGLang's in-place ``pause_generation``) until :meth:`Cell.resume` or an abort. Loading weights
swaps in a new engine: calls in flight finish on the weights they started with, so a load never
aborts a call; it empties the KV cache (computed on the old weights).
"""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np

from sapwood.platform.events import CELL_ROLES
from sapwood.rollout.engines import SamplingParams, load_model_state
from sapwood.rollout.torch_engine import LocalTorchEngine, sampling_logprobs
from sapwood.scheduler.runtime.call_digest import input_digest
from sapwood.scheduler.runtime.device_clock import DeviceClock, DeviceCosts
from sapwood.scheduler.runtime.kv_store import KVEntry, KVStore

__all__ = ["Cell", "input_digest", "params_from_dict"]

KV_CACHE_BYTES = 64 << 20
#: Seconds an aborted call waits for :meth:`Cell.release_aborted` (the KV handoff) before it answers
#: ``aborted`` anyway: a switch driver that died between its abort and its release leaves no call held
#: for ever; the router continues the call on another rollout cell, recomputing its KV there. Counted
#: in ``status()["unreleased_aborts"]``.
RELEASE_WAIT_S = 10.0
"""Default per-cell KV cache budget (bytes)."""


def params_from_dict(d: dict[str, Any]) -> SamplingParams:
    """The :class:`SamplingParams` of a call as it travels between actors (``SamplingParams.to_dict``)."""
    d = dict(d)
    d["stop_token_ids"] = tuple(d.get("stop_token_ids", ()))
    return SamplingParams(**d)


class _Call:
    def __init__(self, key: str, session: str, input_ids: list[int]) -> None:
        self.key = key
        self.session = session
        self.input_ids = input_ids
        self.abort = threading.Event()
        self.release = threading.Event()
        self.stopped = threading.Event()  # set once an aborted call stored its KV and partial output
        self.answers_aborted = False  # set before ``stopped`` when the call takes the aborted answer
        self.output: list[int] = []
        self.generated = 0


class Cell:
    """A cell; ``model_config`` is a ``TinyTransformerConfig`` and ``state`` its ``state_dict``;
    ``kv_cache_bytes`` bounds the per-execution KV cache (LRU by bytes)."""

    def __init__(self, cell_id: str, model_config: Any, state: dict[str, Any], *, version: int = 0,
                 capacity: int = 1, tier: str = "core", role: str = "idle", seed: int = 0,
                 decode_delay_s: float = 0.0, kv_cache_bytes: int = KV_CACHE_BYTES,
                 device_costs: DeviceCosts | None = None, release_wait_s: float = RELEASE_WAIT_S) -> None:
        import torch

        torch.set_num_threads(1)
        if capacity < 1:
            raise ValueError(f"cell capacity must be ≥ 1, got {capacity}")
        if not release_wait_s > 0:
            raise ValueError(f"release_wait_s must be > 0 seconds, got {release_wait_s}")
        self.release_wait_s = release_wait_s
        self.cell_id, self.capacity, self.tier, self.role = cell_id, capacity, tier, role
        self.model_config = model_config
        self.engine = LocalTorchEngine(model_config, state=state, policy_version=version, seed=seed)
        self.generator = torch.Generator().manual_seed(seed)
        self.costs = device_costs if device_costs is not None else DeviceCosts(decode_token_s=decode_delay_s)
        self.clock = DeviceClock()
        self.group: Any = None  # a GroupMember once the cell joined the learner group
        self._learner: Any = None
        self.draining = role != "rollout"
        self._calls: dict[str, _Call] = {}
        self._lock = threading.Lock()
        self._model_lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._gate = threading.Condition()
        self.paused = False
        self.pause_after = 1
        self.held = 0
        self.kv = KVStore(kv_cache_bytes)
        self.served = 0
        self.core: int | None = None  # the CPU core this cell is pinned to, if any
        self.aborted = 0
        self.unreleased_aborts = 0
        self.prefix_hits = 0
        self.reused_tokens = 0
        self.fed_tokens = 0
        self.kv_imports = 0
        self.loads = 0

    # -- serving ------------------------------------------------------------------------------------
    def generate(self, call_key: str, input_ids: list[int], params: dict[str, Any]) -> dict[str, Any]:
        """Serve one call (``params``: ``SamplingParams.to_dict()``, optionally ``decode_scale`` × the
        per-token delay and ``session``, the execution's key for its KV cache; default the call key):
        ``{"status": "ok", output_ids, logprobs, policy_version, finish_reason, timings}`` (``timings``:
        ``latency_s``, ``prefill_s`` = the first step's extend, ``prefill_tokens`` it fed and ``cached_tokens``
        it reused from the session's KV), or
        ``{"status": "refused", "reason"}``, or ``{"status": "aborted", "reason", output_ids, logprobs,
        policy_version}`` with the partial output sampled before the abort (the router continues it)."""
        import torch

        params = dict(params)
        scale = float(params.pop("decode_scale", 1.0))
        session = str(params.pop("session", None) or call_key)
        with self._lock:
            if self.role != "rollout" or self.draining:
                return {"status": "refused", "reason": f"cell {self.cell_id} is {self.role}"
                        f"{' and draining' if self.draining else ''}"}
            if len(self._calls) >= self.capacity:
                return {"status": "refused", "reason": f"cell {self.cell_id} is full ({self.capacity} calls)"}
            call = _Call(call_key, session, list(input_ids))
            self._calls[call_key] = call
        try:
            sp = params_from_dict(params)
            t0 = time.perf_counter()
            engine = self.engine  # a call finishes on the weights it started with; loads swap in a new engine
            version = engine.policy_version
            fed, past, logits = self._start_kv(session, call.input_ids, version)
            pending = call.input_ids[len(fed):]
            cached_tokens, prefill_tokens = len(fed), len(pending)
            lps: list[float] = []
            finish: str | None = None
            prefill_s = 0.0
            for i in range(sp.max_new_tokens):
                if call.abort.is_set():
                    break
                with self._model_lock, torch.inference_mode():
                    t_step = time.perf_counter()
                    t_device = time.monotonic()
                    if pending:
                        logits, past = engine.extend(pending, past)
                        fed.extend(pending)
                        self.fed_tokens += len(pending)
                    if i == 0:
                        prefill_s = time.perf_counter() - t_step
                    logp = sampling_logprobs(logits, sp.temperature, sp.top_p)
                    token = int(torch.multinomial(logp.exp(), 1, generator=self.generator))
                call.output.append(token)
                lps.append(float(logp[token]))
                call.generated = len(call.output)
                pending = [token]
                if token in sp.stop_token_ids:
                    finish = "stop"
                    break
                with self._lock:
                    k = max(len(self._calls), 1)  # the calls sharing this decode step
                self.clock.charge(self.costs.token_share_s(k, scale), t_device, abort=call.abort)
                self._hold_if_paused(call)
            else:
                # all tokens sampled; aborted during the last token's modelled delay: answered as aborted
                # with the whole output (the router completes it without a continuation)
                finish = None if call.abort.is_set() else "length"
            if past is not None:
                self.kv.put(session, KVEntry(tuple(fed), version, past))
            out = {"output_ids": np.asarray(call.output, dtype=np.int32),
                   "logprobs": np.minimum(np.asarray(lps, dtype=np.float32), 0.0), "policy_version": version,
                   "cell_id": self.cell_id, "input_digest": input_digest(call.input_ids)}
            if finish is None:
                # Aborted between two tokens: the partial output and its KV stay (the KV under the
                # session, for export to the target cell); the router continues the call there.
                call.answers_aborted = True
                call.stopped.set()
                released = call.release.wait(self.release_wait_s)
                with self._lock:
                    self.aborted += 1
                    self.unreleased_aborts += not released
                return {"status": "aborted", "reason": f"aborted on {self.cell_id} after {len(call.output)} "
                        "tokens (partial output kept)", **out}
            with self._lock:
                self.served += 1
            return {"status": "ok", **out, "finish_reason": finish,
                    "timings": {"latency_s": time.perf_counter() - t0, "prefill_s": prefill_s,
                                "prefill_tokens": prefill_tokens, "cached_tokens": cached_tokens}}
        finally:
            call.stopped.set()
            with self._lock:
                self._calls.pop(call_key, None)
                self._idle.notify_all()

    def _start_kv(self, session: str, input_ids: list[int], version: int) -> tuple[list[int], Any, Any]:
        """``(tokens already fed, past KV, next-token logits or None)`` to start a call from: the
        session's cached entry when it is reusable for ``input_ids`` (prefix reuse), else nothing."""
        entry = self.kv.take(session)
        if entry is None or not entry.reusable_for(input_ids, version):
            return [], None, None
        self.prefix_hits += 1
        self.reused_tokens += len(entry.tokens)
        logits = entry.logits if len(entry.tokens) == len(input_ids) else None
        return list(entry.tokens), entry.past, logits

    def _hold_if_paused(self, call: _Call) -> None:
        """Wait here, between two tokens, while the cell is paused (an abort ends the wait)."""
        with self._gate:
            if not self.paused or call.generated < self.pause_after:
                return
            self.held += 1
            self._gate.notify_all()
            self._gate.wait_for(lambda: not self.paused or call.abort.is_set())
            self.held -= 1

    def pause(self, after_tokens: int = 1) -> None:
        """Hold every call (in flight or new) once it generated ``after_tokens`` tokens (≥ 1), keeping it
        in flight, until :meth:`resume` or its abort."""
        if after_tokens < 1:
            raise ValueError(f"after_tokens must be ≥ 1, got {after_tokens}")
        with self._gate:
            self.paused, self.pause_after = True, after_tokens

    def resume(self) -> None:
        with self._gate:
            self.paused = False
            self._gate.notify_all()

    def wait_held(self, n: int, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` until ``n`` calls are held by :meth:`pause`; True when they are."""
        with self._gate:
            return self._gate.wait_for(lambda: self.held >= n, timeout=timeout_s)

    # -- switch protocol ----------------------------------------------------------------------------
    def drain(self) -> int:
        """Admit no new calls; returns the number in flight."""
        with self._lock:
            self.draining = True
            return len(self._calls)

    def wait_idle(self, grace_s: float) -> bool:
        """Wait up to ``grace_s`` for the calls in flight to finish; True when none is left."""
        deadline = time.monotonic() + grace_s
        with self._lock:
            while self._calls:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._idle.wait(left)
            return True

    def abort_inflight(self) -> list[tuple[str, str, list[int]]]:
        """Abort every call in flight and wait until each stopped between two tokens; returns
        ``(call_key, session, input ids + partial output)`` of each call that answers ``aborted`` (what the
        continuation is fed). The aborted calls answer only after :meth:`release_aborted` (so the KV handoff
        runs first). A call that finished as the abort came (its stop token sampled in the same step) has
        answered ``ok`` and is not named: nothing would continue it, and a switch waiting for its reroute
        would wait for ever."""
        with self._lock:
            calls = list(self._calls.values())
        for c in calls:
            c.abort.set()
        with self._gate:
            self._gate.notify_all()  # held calls see their abort
        for c in calls:
            c.stopped.wait(30.0)
        return [(c.key, c.session, c.input_ids + c.output) for c in calls if c.answers_aborted]

    def release_aborted(self) -> None:
        with self._lock:
            calls = list(self._calls.values())
        for c in calls:
            c.release.set()

    def prefill(self, session: str, input_ids: list[int]) -> float:
        """Recompute the KV of ``input_ids`` for ``session`` on this cell's weights (the recompute side of
        a handoff) and keep it for the call that continues there; returns seconds spent."""
        import torch

        t0 = time.perf_counter()
        with self._model_lock, torch.inference_mode():
            engine = self.engine
            logits, past = engine.extend(input_ids)
            self.kv.put(session, KVEntry(tuple(input_ids), engine.policy_version, past, logits))
        return time.perf_counter() - t0

    def kv_info(self, session: str) -> dict[str, int] | None:
        """``{"tokens", "bytes", "version"}`` of the session's cached KV, or None."""
        entry = self.kv.peek(session)
        if entry is None:
            return None
        return {"tokens": len(entry.tokens), "bytes": entry.nbytes, "version": entry.version}

    def export_kv(self, session: str) -> list[Any]:
        """Put the session's KV into Ray's object store (the CPU stand-in for an RDMA move); returns
        ``[ObjectRef]`` (a list, so that Ray hands the caller the reference, not the tensors), or ``[]``."""
        import ray

        entry = self.kv.take(session)
        if entry is None:
            return []
        return [ray.put({"tokens": entry.tokens, "version": entry.version,
                         "past": [(k.contiguous(), v.contiguous()) for k, v in entry.past]})]

    def import_kv(self, session: str, ref: list[Any]) -> dict[str, Any]:
        """Take a session's KV that :meth:`export_kv` of another cell put into the object store. Kept only
        when it was computed on the weights this cell serves (else the continuation recomputes); a full
        cache evicts its least recently used sessions. Returns ``{"kept", "bytes", "seconds", "evicted"}``."""
        import ray

        t0 = time.perf_counter()
        if not ref:
            return {"kept": False, "bytes": 0, "seconds": 0.0, "evicted": []}
        payload = ray.get(ref[0])
        entry = KVEntry(tuple(payload["tokens"]), int(payload["version"]), list(payload["past"]))
        kept = entry.version == self.engine.policy_version
        evicted = self.kv.put(session, entry) if kept else []
        if kept:
            self.kv_imports += 1
        return {"kept": kept and session not in evicted, "bytes": entry.nbytes,
                "seconds": time.perf_counter() - t0, "evicted": evicted}

    def load_checkpoint(self, checkpoint: str, version: int) -> float:
        """Serve the policy in ``checkpoint`` as ``version``; returns seconds spent."""
        t0 = time.perf_counter()
        state = load_model_state(checkpoint)
        self.load_state(state, version)
        return time.perf_counter() - t0

    def load_state(self, state: dict[str, Any], version: int) -> None:
        """Serve ``state`` as ``version`` from the next call on (calls in flight finish on their weights)."""
        engine = LocalTorchEngine(self.model_config, state=state, policy_version=version)
        with self._model_lock:
            self.engine = engine
            self.loads += 1
            self.kv.clear()

    # -- training on the cells (runtime/cell_learner.py) ---------------------------------------------
    def join_group(self, spec: Any) -> None:
        """Join the learner group ``spec`` (a ``GroupSpec``; every cell of the run calls it at once)."""
        from sapwood.scheduler.runtime.cell_learner import GroupMember

        self.group = GroupMember(spec, self.model_config, self.clock, lambda: self.costs, lambda: self.role)
        self.group.join()
        self.group.on_role(self.role)

    def set_device_costs(self, costs: DeviceCosts) -> None:
        """Charge this cell's work at ``costs`` from now on."""
        self.costs = costs

    def start_trainer(self, config: Any, state: dict[str, Any], seed: int = 0) -> int:
        """Core: hold the learner replica (optimizer, policy version); returns the version."""
        return int(self.group.start_trainer(config, state, seed).backend.policy_version)

    def train_batch(self, batch: Any) -> dict[str, float]:
        """Core: one SAO step on ``batch`` (a ``TreeBatch``) over the group's micro-batches."""
        return dict(self.group.trainer.train_step(batch))

    def start_learner(self, database_url: str, run_id: str, *, learner_id: str, checkpoint_dir: str,
                      source_config: Any) -> None:
        """Core: train on ``run_id``'s batches from the store (claims, checkpoints, ``policy_published``)."""
        from sapwood.learner.loop import Learner
        from sapwood.platform.store import Store

        self._learner = Learner(Store.open(database_url), run_id, self.group.trainer, learner_id=learner_id,
                                checkpoint_dir=checkpoint_dir, source_config=source_config)

    def learner_step(self, timeout_s: float) -> dict[str, float] | None:
        """Core: train on the next batch (waiting up to ``timeout_s``); None when none came."""
        return self._learner.step(timeout_s=timeout_s)

    def close_learner(self) -> None:
        if self._learner is not None:
            self._learner.close()
            self._learner.store.close()
            self._learner = None

    def learner_state(self) -> tuple[int, dict[str, Any]]:
        """Core: ``(version, weights in TinyActorCritic layout)`` of the learner replica."""
        return self.group.trainer.backend.policy_version, self.group.serving_state()

    def broadcast_weights(self, ranks: list[int]) -> int:
        """Core: send the newest weights to ``ranks`` in buckets (each calls :meth:`receive_weights`); a core
        in rollout serves them too. Returns the version."""
        version = int(self.group.broadcast(ranks))
        if self.role == "rollout":
            self.load_state(self.learner_state()[1], version)
        return version

    def receive_weights(self) -> int:
        """Receive one weights broadcast from the core and serve it from the next call on; returns its version."""
        version, state = self.group.receive(self.engine.model.state_dict())
        self.load_state(state, version)
        return int(version)

    def group_stats(self) -> dict[str, Any]:
        """The group's view from this cell: the core's accepted / refused / released (stale gradients that
        arrived between steps are refused first), gradients sent by this cell, and the class of the
        learner replica's backend (None on a cell that holds none)."""
        import dataclasses

        if self.group.is_core:
            self.group.refuse_pending()
        trainer = self.group.trainer
        replica = None if trainer is None else type(trainer.group_backend).__name__
        return {**dataclasses.asdict(self.group.stats), "sent": self.group.sent, "replica": replica}

    def load_from_core(self, core: Any) -> tuple[int, float]:
        """Take the authoritative parameters from core cell ``core``; returns ``(version, seconds)``."""
        import ray

        t0 = time.perf_counter()
        version, state = ray.get(core.params.remote())
        self.load_state(state, version)
        return version, time.perf_counter() - t0

    def params(self) -> tuple[int, dict[str, Any]]:
        """``(version, state_dict)`` this cell holds (authoritative on a core cell in the train role)."""
        with self._model_lock:
            state = {k: v.detach().clone() for k, v in self.engine.model.state_dict().items()}
            return self.engine.policy_version, state

    def set_role(self, role: str) -> None:
        if role not in CELL_ROLES:
            raise ValueError(f"role must be one of {CELL_ROLES}, got {role!r}")
        with self._lock:
            self.role = role
            self.draining = role != "rollout"
        if self.group is not None:
            self.group.on_role(role)

    def pin_to_core(self, core: int) -> list[int]:
        """Pin this cell's process (every thread) to ``core`` (``runtime/core_pinning.py``); returns the
        cores its threads may run on afterwards."""
        from sapwood.scheduler.runtime.core_pinning import pin_process

        self.core = core
        return sorted(pin_process(core))

    def status(self) -> dict[str, Any]:
        with self._lock:
            return {"cell_id": self.cell_id, "role": self.role, "core": self.core, "tier": self.tier,
                    "capacity": self.capacity,
                    "in_flight": len(self._calls), "draining": self.draining, "served": self.served,
                    "aborted": self.aborted, "unreleased_aborts": self.unreleased_aborts,
                    "prefix_hits": self.prefix_hits, "reused_tokens": self.reused_tokens,
                    "fed_tokens": self.fed_tokens, "kv_imports": self.kv_imports, **self.kv.stats(),
                    "paused": self.paused, "held": self.held, **self.clock.stats(),
                    "policy_version": self.engine.policy_version}
