"""Replays: an event id seen again is a duplicate only when its content is identical.

Each stored event keeps :func:`content_digest` (``events.content_digest``); a replay with another
digest is a :class:`ConflictError` that names what differs (envelope keys, scalar fields, arrays).
``created_at`` is not part of an event's identity: a producer retry that re-stamps the time at send is a
duplicate (the first stored copy's stamp stays). Rows stored before this rule hold a digest that covered
``created_at``; :func:`matches_stored` accepts that legacy digest too.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import orjson

from sapwood.platform.errors import ConflictError
from sapwood.platform.events import Event, ModelCall
from sapwood.platform.tokens import digest_bytes

#: (execution id, seq, kind, content digest or None before revision 0008) of a stored event.
Prior = tuple[str | None, int | None, str, bytes | None]

#: ``stored_event(event_id)`` → the stored ``events`` row of that id, or None.
StoredEvent = Callable[[str], Mapping[str, Any] | None]

#: The envelope keys that are part of an event's identity (``created_at`` is not, see the module doc).
_ENVELOPE_KEYS = ("kind", "execution_id", "seq", "schema_version")


def content_digest(event: Event, digest_of: Callable[[np.ndarray], bytes] | None = None, *,
                   legacy_created_at: bool = False) -> bytes:
    """BLAKE2b-128 of ``event``'s canonical content: its kind, envelope (less ``created_at``) and scalar
    fields (sorted-key JSON) and each array's name, dtype and span digest. Equal for a replay that differs
    at most in ``created_at``, different when any field or token differs; ``digest_of`` supplies span
    digests already computed (default: hash the bytes); ``legacy_created_at`` covers ``created_at`` too,
    as digests stored before ``created_at`` left the identity did."""
    digest = digest_of or (lambda arr: digest_bytes(np.ascontiguousarray(arr).data))
    head: dict[str, Any] = {"kind": event.kind, "event_id": event.event_id, "execution_id": event.execution_id,
                            "seq": event.seq, "schema_version": event.schema_version, "fields": event.scalar_fields()}
    if legacy_created_at:
        head["created_at"] = event.created_at
    h = hashlib.blake2b(orjson.dumps(head, option=orjson.OPT_SORT_KEYS | orjson.OPT_SERIALIZE_NUMPY,
                                     default=str), digest_size=16)
    for name, arr in event.array_fields().items():
        h.update(f"/{name}:{arr.dtype.str}:{arr.size}:".encode())
        if arr.size:
            h.update(digest(arr))
    return h.digest()


def matches_stored(stored_digest: bytes, event: Event) -> bool:
    """Whether ``event`` has the content of the stored digest (the current one, or a legacy one that
    covered ``created_at``)."""
    return stored_digest == content_digest(event) or stored_digest == content_digest(event, legacy_created_at=True)


def _differences(stored_event: StoredEvent, event: Event) -> list[str]:
    """Names of what differs between ``event`` and the stored event of the same id (best effort)."""
    row = stored_event(event.event_id)
    if row is None:
        return []
    diff = [k for k in _ENVELOPE_KEYS if str(row[k]) != str(getattr(event, k))]
    body = dict(row["body"] or {})
    stored_arrays = body.pop("arrays", {}) or {}
    normalized = isinstance(event, ModelCall) and event.parent is None  # stored with the matched node as parent
    defaults = event.scalar_defaults()  # a field at its default is left out of the stored body
    for name, value in event.scalar_fields().items():
        if normalized and name == "parent":
            continue
        if orjson.dumps(body.get(name, defaults.get(name)), default=str) != orjson.dumps(value, default=str):
            diff.append(name)
    for name, arr in event.array_fields().items():
        if normalized and name == "appended":
            continue
        ref = stored_arrays.get(name) or [None, 0]
        mine = [digest_bytes(np.ascontiguousarray(arr).data).hex() if arr.size else None, int(arr.size)]
        if list(ref) != mine:
            diff.append(name)
    return diff or (["appended"] if normalized else ["content"])


def _batch_differences(a: Event, b: Event) -> list[str]:
    """Names of what differs between two events of one id in the same batch."""
    diff = [k for k in _ENVELOPE_KEYS if getattr(a, k) != getattr(b, k)]
    if type(a) is type(b):
        fa, fb = a.scalar_fields(), b.scalar_fields()
        diff += [k for k in fa if orjson.dumps(fa[k], default=str) != orjson.dumps(fb.get(k), default=str)]
        arrays_b = b.array_fields()
        diff += [k for k, arr in a.array_fields().items() if not np.array_equal(arr, arrays_b[k])]
    return diff or ["content"]


def replay_conflict(stored_event: StoredEvent, ev: Event, prior: Prior) -> ConflictError:
    """The conflict of ``ev`` with the stored event ``prior`` of its id (keys, then what differs, read
    from the stored row ``stored_event`` returns)."""
    if (prior[0], prior[1], prior[2]) != (ev.execution_id, ev.seq, ev.kind):
        return ConflictError(
            f"event id {ev.event_id} was already stored as {prior[2]} seq {prior[1]} of "
            f"execution {prior[0]}; this event reuses it with different content"
        )
    fields_ = ", ".join(_differences(stored_event, ev))
    return ConflictError(
        f"event id {ev.event_id} ({ev.kind} seq {ev.seq} of execution {ev.execution_id}) was already stored "
        f"with different content: {fields_} differ; expected a byte-identical replay or a new event id"
    )


def same_batch_conflict(first: Event, ev: Event) -> ConflictError | None:
    """None when ``ev`` repeats ``first`` (same id, same batch) exactly, else the conflict naming what differs."""
    if content_digest(first) == content_digest(ev):
        return None
    return ConflictError(
        f"event id {ev.event_id} appears twice in one batch with different content: "
        f"{', '.join(_batch_differences(first, ev))} differ; expected a byte-identical replay or a new event id")


__all__ = ["Prior", "StoredEvent", "content_digest", "matches_stored", "replay_conflict", "same_batch_conflict"]
