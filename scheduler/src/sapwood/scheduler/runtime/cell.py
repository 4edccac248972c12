"""A cell: a capacity and a role (rollout | train | idle); one Ray actor per cell (:mod:`.cluster` makes it one).

In the rollout role the cell serves engine calls with the local torch engine
(:class:`~sapwood.rollout.torch_engine.LocalTorchEngine`: the learner's ``TinyActorCritic`` on CPU), at
most ``capacity`` at a time, token by token so that a call can be aborted between two tokens. A
draining cell refuses new calls; an aborted call answers ``aborted`` and its partial output is
discarded (see :meth:`Cell.abort_inflight` for why). The cell holds no execution state: agent loops
and environments live in their own actors (:mod:`~sapwood.demo.elastic.executions`).

``decode_delay_s`` adds a sleep after each generated token (× the call's ``decode_scale``), standing in
for a larger model's per-token latency on a CPU where the tiny model decodes in microseconds (0 in
production). Loading weights swaps in a new engine: calls in flight finish on the weights they
started with, so a load never aborts a call.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from typing import Any

import numpy as np

from sapwood.platform.events import CELL_ROLES
from sapwood.rollout.engines import SamplingParams, load_model_state
from sapwood.rollout.torch_engine import LocalTorchEngine, sampling_logprobs

__all__ = ["Cell", "input_digest", "params_from_dict"]

PREFIX_CACHE = 64


def input_digest(input_ids: list[int]) -> str:
    """BLAKE2b-128 of the int32 little-endian input ids: what a cell echoes so the caller can check that
    the attempt that completed saw exactly its input."""
    import hashlib

    return hashlib.blake2b(np.asarray(input_ids, dtype="<i4").tobytes(), digest_size=16).hexdigest()


def params_from_dict(d: dict[str, Any]) -> SamplingParams:
    """The :class:`SamplingParams` of a call as it travels between actors (``SamplingParams.to_dict``)."""
    d = dict(d)
    d["stop_token_ids"] = tuple(d.get("stop_token_ids", ()))
    return SamplingParams(**d)


class _Call:
    def __init__(self, key: str, input_ids: list[int]) -> None:
        self.key = key
        self.input_ids = input_ids
        self.abort = threading.Event()
        self.release = threading.Event()
        self.generated = 0


class Cell:
    """A cell; ``model_config`` is a ``TinyTransformerConfig`` and ``state`` its ``state_dict``."""

    def __init__(self, cell_id: str, model_config: Any, state: dict[str, Any], *, version: int = 0,
                 capacity: int = 1, tier: str = "core", role: str = "idle", seed: int = 0,
                 decode_delay_s: float = 0.0) -> None:
        import torch

        torch.set_num_threads(1)
        if capacity < 1:
            raise ValueError(f"cell capacity must be ≥ 1, got {capacity}")
        self.cell_id, self.capacity, self.tier, self.role = cell_id, capacity, tier, role
        self.model_config = model_config
        self.engine = LocalTorchEngine(model_config, state=state, policy_version=version, seed=seed)
        self.generator = torch.Generator().manual_seed(seed)
        self.decode_delay_s = decode_delay_s
        self.draining = role != "rollout"
        self._calls: dict[str, _Call] = {}
        self._lock = threading.Lock()
        self._model_lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._prefix: OrderedDict[tuple[int, tuple[int, ...]], Any] = OrderedDict()
        self.served = 0
        self.aborted = 0
        self.prefix_hits = 0
        self.loads = 0

    # -- serving ------------------------------------------------------------------------------------
    def generate(self, call_key: str, input_ids: list[int], params: dict[str, Any]) -> dict[str, Any]:
        """Serve one call (``params``: ``SamplingParams.to_dict()``, optionally ``decode_scale`` × the
        per-token delay): ``{"status": "ok", output_ids, logprobs, policy_version, finish_reason, timings}``,
        or ``{"status": "refused" | "aborted", "reason"}`` (nothing of an aborted call is returned)."""
        import torch

        with self._lock:
            if self.role != "rollout" or self.draining:
                return {"status": "refused", "reason": f"cell {self.cell_id} is {self.role}"
                        f"{' and draining' if self.draining else ''}"}
            if len(self._calls) >= self.capacity:
                return {"status": "refused", "reason": f"cell {self.cell_id} is full ({self.capacity} calls)"}
            call = _Call(call_key, list(input_ids))
            self._calls[call_key] = call
        try:
            params = dict(params)
            scale = float(params.pop("decode_scale", 1.0))
            sp = params_from_dict(params)
            t0 = time.perf_counter()
            engine = self.engine  # a call finishes on the weights it started with; loads swap in a new engine
            version = engine.policy_version
            seq = torch.tensor(call.input_ids, dtype=torch.int64)
            out: list[int] = []
            lps: list[float] = []
            finish = "length"
            prefill_s = 0.0
            for i in range(sp.max_new_tokens):
                if call.abort.is_set():
                    break
                with self._model_lock, torch.inference_mode():
                    t_step = time.perf_counter()
                    logits = self._prefix.pop((version, tuple(call.input_ids)), None) if i == 0 else None
                    if logits is None:
                        logits = engine.next_token_logits(seq).float()
                    else:
                        self.prefix_hits += 1
                    if i == 0:
                        prefill_s = time.perf_counter() - t_step
                    logp = sampling_logprobs(logits, sp.temperature, sp.top_p)
                    token = int(torch.multinomial(logp.exp(), 1, generator=self.generator))
                out.append(token)
                lps.append(float(logp[token]))
                call.generated = len(out)
                seq = torch.cat([seq, torch.tensor([token])])
                if token in sp.stop_token_ids:
                    finish = "stop"
                    break
                if self.decode_delay_s > 0:
                    call.abort.wait(self.decode_delay_s * scale)
            if call.abort.is_set():
                # The partial output is discarded, not continued elsewhere: its tokens were sampled
                # by this cell and never reach the recorder, so an aborted attempt leaves no
                # trainable tokens; the re-issued call samples afresh from the same input ids.
                call.release.wait(10.0)
                with self._lock:
                    self.aborted += 1
                return {"status": "aborted", "reason": f"aborted on {self.cell_id} after {len(out)} tokens "
                        "(partial output discarded)", "discarded_tokens": len(out)}
            with self._lock:
                self.served += 1
            return {"status": "ok", "output_ids": np.asarray(out, dtype=np.int32),
                    "logprobs": np.minimum(np.asarray(lps, dtype=np.float32), 0.0), "policy_version": version,
                    "finish_reason": finish, "cell_id": self.cell_id, "input_digest": input_digest(call.input_ids),
                    "timings": {"latency_s": time.perf_counter() - t0, "prefill_s": prefill_s}}
        finally:
            with self._lock:
                self._calls.pop(call_key, None)
                self._idle.notify_all()

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

    def abort_inflight(self) -> list[tuple[str, list[int]]]:
        """Abort every call in flight; returns ``(call_key, input_ids)`` of each. The aborted calls
        answer only after :meth:`release_aborted` (so the KV handoff runs before they are re-issued)."""
        with self._lock:
            calls = list(self._calls.values())
        for c in calls:
            c.abort.set()
        return [(c.key, c.input_ids) for c in calls]

    def release_aborted(self) -> None:
        with self._lock:
            calls = list(self._calls.values())
        for c in calls:
            c.release.set()

    def prefill(self, input_ids: list[int]) -> float:
        """Recompute the prefix state of ``input_ids`` (the next-token logits; the local engine keeps no
        KV cache across tokens) and keep it for the call that re-issues them; returns seconds spent."""
        import torch

        t0 = time.perf_counter()
        with self._model_lock, torch.inference_mode():
            engine = self.engine
            logits = engine.next_token_logits(torch.tensor(input_ids, dtype=torch.int64)).float()
            self._prefix[(engine.policy_version, tuple(input_ids))] = logits
            while len(self._prefix) > PREFIX_CACHE:
                self._prefix.popitem(last=False)
        return time.perf_counter() - t0

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
            self._prefix.clear()

    def train_work(self, seconds: float) -> float:
        """This cell's share of a training step, modelled as ``seconds`` of occupancy (the demo's cost model:
        two shared CPU cores cannot show a data-parallel speed-up); returns seconds spent."""
        t0 = time.perf_counter()
        time.sleep(max(seconds, 0.0))
        return time.perf_counter() - t0

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

    def status(self) -> dict[str, Any]:
        with self._lock:
            return {"cell_id": self.cell_id, "role": self.role, "tier": self.tier, "capacity": self.capacity,
                    "in_flight": len(self._calls), "draining": self.draining, "served": self.served,
                    "aborted": self.aborted, "prefix_hits": self.prefix_hits,
                    "policy_version": self.engine.policy_version}
