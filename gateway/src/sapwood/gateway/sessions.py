"""Sessions of proxied traffic: who a request belongs to, and when a session ends.

A session is named by a path prefix (``/s/{session}/v1/...``, for clients that can only set a base
URL) or by the ``X-Session-Id`` header; ``X-Parent-Session-Id`` (sub-agents), ``X-Run-Id``,
``X-Task-Id``, ``X-Task-Family`` and ``X-Policy-Version`` label it. A session not heard from for
``idle_timeout_s`` seconds ends with status ``timeout``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from sapwood.gateway.tree import SessionTree

_PREFIX = re.compile(r"^/s/(?P<session>[A-Za-z0-9._:-]{1,200})(?P<rest>/.*)$")
LABEL_HEADERS = {
    "x-parent-session-id": "parent_session",
    "x-run-id": "run",
    "x-task-id": "task",
    "x-task-family": "task_family",
    "x-policy-version": "policy_version",
}


class SessionError(ValueError):
    """A request names no session, or names it badly; the message says what was expected."""


@dataclass(frozen=True)
class SessionRef:
    """The session a request belongs to, its labels, and the upstream path left after the prefix."""

    session_id: str
    path: str
    labels: dict[str, str]


def resolve(path: str, headers: Mapping[str, str]) -> SessionRef:
    """Session id from ``/s/{id}/...`` or ``X-Session-Id`` (they must agree when both are given)."""
    lower = {k.lower(): v for k, v in headers.items()}
    header_id = lower.get("x-session-id")
    match = _PREFIX.match(path)
    if match:
        session_id, rest = match.group("session"), match.group("rest")
        if header_id is not None and header_id != session_id:
            raise SessionError(f"path names session {session_id!r} but X-Session-Id says {header_id!r}")
    elif path.startswith("/s/"):
        raise SessionError(f"bad session prefix in {path!r}: expected /s/<id>/v1/... with id of [A-Za-z0-9._:-]")
    elif header_id:
        session_id, rest = header_id, path
    else:
        raise SessionError("no session: prefix the path with /s/<session-id> or send an X-Session-Id header")
    labels = {name: lower[h] for h, name in LABEL_HEADERS.items() if lower.get(h)}
    return SessionRef(session_id, rest, labels)


@dataclass
class Session:
    """One open session: its tree of calls and when it was last heard from (monotonic seconds)."""

    session_id: str
    labels: dict[str, str]
    last_seen: float
    tree: SessionTree = field(default_factory=SessionTree)
    #: Output node id of each recorded call, in the tree's order (a ``next`` call is recorded below it).
    call_nodes: list[str] = field(default_factory=list)
    status: str | None = None


class SessionTable:
    """Open sessions by id; ``finish`` and ``expire`` close them with a status."""

    def __init__(self, idle_timeout_s: float) -> None:
        if not idle_timeout_s > 0:
            raise ValueError(f"idle_timeout_s must be > 0 seconds, got {idle_timeout_s!r}")
        self.idle_timeout_s = idle_timeout_s
        self.open: dict[str, Session] = {}

    def touch(self, ref: SessionRef, now: float) -> Session:
        """The open session for ``ref`` (created on first sight), marked as heard from at ``now``."""
        session = self.open.get(ref.session_id)
        if session is None:
            session = self.open[ref.session_id] = Session(ref.session_id, dict(ref.labels), now)
        session.labels.update(ref.labels)
        session.last_seen = now
        return session

    def reopen(self, session_id: str, labels: dict[str, str], now: float) -> Session:
        """An open session taken back after a restart (its idle time counts from ``now``)."""
        session = self.open[session_id] = Session(session_id, dict(labels), now)
        return session

    def finish(self, session_id: str, status: str) -> Session:
        """Close a session with ``status``; KeyError names an unknown session."""
        session = self.open.pop(session_id, None)
        if session is None:
            raise KeyError(f"no open session {session_id!r}")
        session.status = status
        return session

    def expire(self, now: float) -> list[Session]:
        """Close every session idle for at least ``idle_timeout_s`` with status ``timeout``."""
        idle = [s for s in self.open.values() if now >= s.last_seen + self.idle_timeout_s]
        return [self.finish(s.session_id, "timeout") for s in idle]
