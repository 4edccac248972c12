"""The router: sends each engine call to a rollout cell, keeps an execution on one cell, and continues a
call elsewhere when its attempt is lost.

Sticky: a call that names a ``session`` (its execution's key) goes to the cell that served the session's
previous call while that cell is in rollout, so the cell's KV of the execution is reused. When that cell
is full and another has a free slot, the call waits for the sticky cell no longer than recomputing its
context elsewhere would take (:meth:`Router.sticky_wait`: its tokens × the prefill seconds per token
measured from the cells' answers that recomputed a whole context), and at most ``sticky_wait_s`` (also
the wait before any rate is measured). Waiting longer than the recomputation idles a free slot to save
less than it costs; a long context (a costly prefill) waits, a short one moves.

An attempt is lost when its cell aborts it (a switch's grace period ran out) or dies (``ray.kill``,
a crash: :class:`ray.exceptions.RayActorError`). An aborted attempt answers with its partial output:
the router re-issues the call with input ids + partial output and the remaining token budget on
another rollout cell (the switch's KV-handoff target, waited for up to ``hint_wait_s`` when it is full:
the hint is queued, not dropped), and the answer is partial + continuation, one call. A dead cell's
partial output is lost with it; that call restarts from its input ids. Only the completing attempt's
answer is returned, so the execution records exactly one TITO call per logical call — none lost,
none duplicated.

Queue lag (:meth:`Router.queue`): the calls waiting for a slot now (in :meth:`Router._pick`, a refused
attempt waiting again included) and each rollout cell's occupied slots; the scheduler's rollout demand
is their sum (:func:`sapwood.scheduler.signals.queue_demand`).

Slot time per session (:meth:`Router.session_times`): the seconds each session's calls waited for a slot
and the seconds they held one (an attempt's RPC to its cell, from the slot's taking to its release). An
execution's wall time minus its waiting is what it would take on an idle cluster; held ÷ that is the
share of it a slot is busy (the simulator's calibration, ``sapwood.demo.elastic.compare``).

Policy version of a continued call: ``policy_version`` is the version at the call's start (the oldest
weights any of its tokens came from), and when the continuation ran on other weights the answer says
``version_changed: True`` with ``policy_versions`` ``[start, end]``. Every token's logged log-prob is
the behaviour policy that sampled it either way, which is what the learner's importance ratios need;
the staleness bound then measures the call from its oldest token (conservative).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
import uuid
from typing import Any

import numpy as np
from ray.exceptions import RayActorError

from sapwood.scheduler.runtime.call_digest import input_digest

__all__ = ["PREFILL_EWMA", "Router"]

PREFILL_EWMA = 0.2
"""Weight of each new measurement in the router's running prefill seconds per token."""


class Router:
    """Routes calls over cells (an async Ray actor, made one in :mod:`.cluster`); ``add_cell`` registers each
    cell's actor handle, capacity and role."""

    def __init__(self, *, no_cell_timeout_s: float = 120.0, sticky_wait_s: float = 1.0,
                 hint_wait_s: float = 30.0) -> None:
        self.cells: dict[str, Any] = {}
        self.capacity: dict[str, int] = {}
        self.roles: dict[str, str] = {}
        self.load: dict[str, int] = {}
        self.draining: set[str] = set()
        self.lost: dict[str, str] = {}
        self.hints: dict[str, str] = {}
        self.rerouted_keys: dict[str, str] = {}
        self.pending_reroute: set[str] = set()
        self.sessions: dict[str, str] = {}
        self.reserved: dict[str, int] = {}
        self.no_cell_timeout_s = no_cell_timeout_s
        self.sticky_wait_s, self.hint_wait_s = sticky_wait_s, hint_wait_s
        self.waiting = 0
        self.slot_time: dict[str, list[float]] = {}  # session -> [waited_s, held_s]
        self.prefill_s_per_token: float | None = None  # running average, from whole-context recomputations
        self.counts = {"calls": 0, "attempts": 0, "rerouted": 0, "aborted": 0, "cell_lost": 0, "refused": 0,
                       "discarded_tokens": 0, "continued_tokens": 0, "sticky": 0, "sticky_left": 0,
                       "version_changed": 0}
        self._changed = asyncio.Event()

    # -- membership ---------------------------------------------------------------------------------
    def add_cell(self, cell_id: str, handle: Any, capacity: int, role: str) -> None:
        self.cells[cell_id], self.capacity[cell_id], self.roles[cell_id] = handle, capacity, role
        self.load.setdefault(cell_id, 0)
        self._changed.set()

    def set_role(self, cell_id: str, role: str) -> None:
        self.roles[cell_id] = role
        self.draining.discard(cell_id)
        self._changed.set()

    def drain(self, cell_id: str) -> None:
        """Route no new call to ``cell_id``."""
        self.draining.add(cell_id)

    def plan_reroute(self, call_keys: list[str], source: str) -> dict[str, str | None]:
        """Pick a target cell for each aborted call (least loaded rollout cell other than ``source``) and
        remember it as a hint; the calls count as pending until re-admitted (:meth:`wait_rerouted`)."""
        out: dict[str, str | None] = {}
        extra: dict[str, int] = {}
        for key in call_keys:
            free = [c for c in self._eligible() if c != source]
            free.sort(key=lambda c: (self.load[c] + extra.get(c, 0)) / self.capacity[c])
            target = free[0] if free else None
            out[key] = target
            if target is not None:
                self._drop_hint(key)
                self.hints[key] = target
                self.reserved[target] = self.reserved.get(target, 0) + 1  # the next free slot there is its
                extra[target] = extra.get(target, 0) + 1
            self.pending_reroute.add(key)
        return out

    async def wait_rerouted(self, call_keys: list[str], timeout_s: float) -> bool:
        """Wait until every one of ``call_keys`` was re-admitted on another cell (or finished)."""
        deadline = time.monotonic() + timeout_s
        while any(k in self.pending_reroute for k in call_keys):
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(0.002)
        return True

    def _drop_hint(self, key: str) -> str | None:
        """Forget ``key``'s hint and free the slot reserved for it; returns the hinted cell."""
        hint = self.hints.pop(key, None)
        if hint is not None:
            self.reserved[hint] -= 1
        return hint

    def _eligible(self) -> list[str]:
        return [c for c, r in self.roles.items() if r == "rollout" and c not in self.draining and c not in self.lost]

    def sticky_wait(self, context_tokens: int) -> float:
        """Seconds a call of ``context_tokens`` tokens waits for its session's full sticky cell while another
        cell has a free slot: what recomputing the context there would take (tokens × the measured prefill
        seconds per token), at most ``sticky_wait_s``; ``sticky_wait_s`` before any rate is measured."""
        if self.prefill_s_per_token is None:
            return self.sticky_wait_s
        return min(self.sticky_wait_s, max(context_tokens, 0) * self.prefill_s_per_token)

    def _learn_prefill(self, timings: dict[str, Any]) -> None:
        """Update the prefill seconds per token from an answer that recomputed a whole context (no cached
        prefix: a session's first call, or one that moved); other answers, or odd figures, are ignored."""
        tokens, seconds = timings.get("prefill_tokens"), timings.get("prefill_s")
        if timings.get("cached_tokens") != 0 or not isinstance(tokens, int) or tokens < 1 or seconds is None:
            return
        rate = float(seconds) / tokens
        if not math.isfinite(rate) or rate < 0:
            return
        old = self.prefill_s_per_token
        self.prefill_s_per_token = rate if old is None else (1 - PREFILL_EWMA) * old + PREFILL_EWMA * rate

    async def _pick(self, key: str, session: str | None, context_tokens: int = 0) -> str | None:
        """A cell with a free slot: the switch's hint for ``key`` (the next slot freed there is reserved for
        it, waited for up to ``hint_wait_s``), else the session's sticky cell (waited for up to
        :meth:`sticky_wait` of ``context_tokens``), else the least loaded; None after ``no_cell_timeout_s``."""
        now = time.monotonic()
        deadline = now + self.no_cell_timeout_s
        hint_until, sticky_until = now + self.hint_wait_s, now + self.sticky_wait(context_tokens)
        while True:
            eligible = self._eligible()
            hint = self.hints.get(key)
            if hint is not None:
                if hint in eligible and self.load[hint] < self.capacity[hint]:
                    return str(self._drop_hint(key))
                if hint not in eligible or time.monotonic() > hint_until:
                    self._drop_hint(key)
                    hint = None
            if hint is None:
                free = [c for c in eligible if self.load[c] + self.reserved.get(c, 0) < self.capacity[c]]
                sticky = self.sessions.get(session or "")
                if sticky in free:
                    self.counts["sticky"] += 1
                    return sticky
                if free and not (sticky in eligible and time.monotonic() < sticky_until):
                    self.counts["sticky_left"] += sticky in eligible  # its full cell waited out: it moves
                    return min(free, key=lambda c: self.load[c] / self.capacity[c])
            if time.monotonic() > deadline:
                return None
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), timeout=0.01)

    # -- calls --------------------------------------------------------------------------------------
    async def generate(self, input_ids: list[int], params: dict[str, Any]) -> dict[str, Any]:
        """Serve one logical call (``params`` may name the execution's ``session``); the answer carries
        ``attempts`` (each lost attempt's cell and why) and ``continued_tokens`` (partial output of
        aborted attempts it kept)."""
        key = str(uuid.uuid4())
        session = params.get("session")
        self.counts["calls"] += 1
        attempts: list[dict[str, Any]] = []
        kept_ids: list[int] = []
        kept_lps: list[float] = []
        start_version: int | None = None
        budget = int(params.get("max_new_tokens", 1))
        try:
            times = self.slot_time.setdefault(str(session), [0.0, 0.0]) if session is not None else [0.0, 0.0]
            while True:
                self.waiting += 1
                t_wait = time.monotonic()
                try:
                    cid = await self._pick(key, session, len(input_ids) + len(kept_ids))
                finally:
                    self.waiting -= 1
                    times[0] += time.monotonic() - t_wait
                if cid is None:
                    return {"status": "error", "reason": f"no rollout cell had a free slot for "
                            f"{self.no_cell_timeout_s:.0f} s", "attempts": attempts}
                self.load[cid] += 1
                self.pending_reroute.discard(key)
                self.counts["attempts"] += 1
                attempt_ids = input_ids + kept_ids
                body = {**params, "max_new_tokens": budget - len(kept_ids)}
                t_held = time.monotonic()
                try:
                    res: dict[str, Any] = await self.cells[cid].generate.remote(key, attempt_ids, body)
                except RayActorError as exc:
                    self.lost.setdefault(cid, f"{type(exc).__name__}: {str(exc)[:300]}")
                    self.counts["cell_lost"] += 1
                    res = {"status": "lost", "reason": f"cell {cid} died mid-call"}
                    self.counts["discarded_tokens"] += len(kept_ids)
                    kept_ids, kept_lps, start_version = [], [], None  # restart from the input ids
                finally:
                    self.load[cid] -= 1
                    times[1] += time.monotonic() - t_held
                    self._changed.set()
                status = res.get("status")
                if status in ("ok", "aborted") and res.get("input_digest") != input_digest(attempt_ids):
                    res = {"status": "error", "reason": f"cell {cid} answered for other input ids than the "
                           f"attempt's ({len(attempt_ids)} tokens)", "attempts": attempts}
                    return res
                if status in ("ok", "aborted"):
                    if start_version is None:
                        start_version = int(res["policy_version"])
                    if session is not None:
                        self.sessions[str(session)] = cid
                if status == "ok":
                    self._learn_prefill(res.get("timings") or {})
                    return self._joined(res, input_ids, kept_ids, kept_lps, start_version, attempts)
                if status == "refused":
                    self.counts["refused"] += 1
                    await asyncio.sleep(0.002)
                    continue
                if status == "aborted":
                    self.counts["aborted"] += 1
                    kept_ids += [int(t) for t in res["output_ids"]]
                    kept_lps += [float(x) for x in res["logprobs"]]
                attempts.append({"cell_id": cid, "status": status, "reason": res.get("reason", "")})
                if status == "aborted" and len(kept_ids) >= budget:  # aborted after its last token: complete
                    res = {**res, "status": "ok", "output_ids": [], "logprobs": [], "finish_reason": "length",
                           "timings": {}}
                    return self._joined(res, input_ids, kept_ids, kept_lps, start_version, attempts)
        finally:
            self.pending_reroute.discard(key)
            self._drop_hint(key)

    def _joined(self, res: dict[str, Any], input_ids: list[int], kept_ids: list[int], kept_lps: list[float],
                start_version: int | None, attempts: list[dict[str, Any]]) -> dict[str, Any]:
        """The answer of a logical call: kept partial output + the completing attempt's, one version."""
        end_version = int(res["policy_version"])
        out = {**res, "attempts": attempts, "continued_tokens": len(kept_ids),
               "output_ids": np.asarray(kept_ids + [int(t) for t in res["output_ids"]], dtype=np.int32),
               "logprobs": np.asarray(kept_lps + [float(x) for x in res["logprobs"]], dtype=np.float32),
               "input_digest": input_digest(input_ids), "policy_version": start_version,
               "policy_versions": [start_version, end_version], "version_changed": start_version != end_version}
        if attempts:
            self.counts["rerouted"] += 1
        self.counts["continued_tokens"] += len(kept_ids)
        self.counts["version_changed"] += int(start_version != end_version)
        return out

    def queue(self) -> dict[str, Any]:
        """``{"waiting": calls waiting for a slot, "occupied": {rollout cell: slots in use}}``."""
        return {"waiting": self.waiting,
                "occupied": {c: self.load[c] for c, r in self.roles.items() if r == "rollout" and c not in self.lost}}

    def session_times(self) -> dict[str, dict[str, float]]:
        """``{session: {"waited_s": seconds its calls waited for a slot, "held_s": seconds they held one}}``."""
        return {k: {"waited_s": w, "held_s": h} for k, (w, h) in self.slot_time.items()}

    def stats(self) -> dict[str, Any]:
        return {**self.counts, "lost_cells": dict(self.lost), "load": dict(self.load), "roles": dict(self.roles),
                "draining": sorted(self.draining), "waiting": self.waiting,
                "prefill_s_per_token": self.prefill_s_per_token}
