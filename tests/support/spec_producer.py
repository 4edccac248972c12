"""A TITO producer written from docs/wire-format.md alone: no ``sapwood`` import (struct, json, hashlib, uuid,
zstandard only). The wire-format test checks that what it writes is accepted and reconstructs exactly, so the
document stays sufficient for a producer in another language."""

from __future__ import annotations

import hashlib
import json
import struct
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import zstandard

MAGIC = b"SPWD"
WIRE_VERSION = 1
FLAG_ZSTD = 0x01


def node_id(event_id: str, part: str) -> str:
    """Spec §4: UUIDv8 from BLAKE2b-128 of "<event_id>/<part>", version and variant bits set."""
    h = bytearray(hashlib.blake2b(f"{event_id}/{part}".encode(), digest_size=16).digest())
    h[6] = (h[6] & 0x0F) | 0x80
    h[8] = (h[8] & 0x3F) | 0x80
    return str(uuid.UUID(bytes=bytes(h)))


def pack_ids(ids: list[int]) -> bytes:
    return struct.pack(f"<{len(ids)}i", *ids)


def pack_logprobs(values: list[float]) -> bytes:
    return struct.pack(f"<{len(values)}f", *values)


def input_digest(ids: list[int]) -> str:
    """Spec §5: hex BLAKE2b-128 of the full input, packed int32 little-endian."""
    return hashlib.blake2b(pack_ids(ids), digest_size=16).hexdigest()


def record(header: dict[str, Any], arrays: list[tuple[str, str, bytes, int]], *, compress: str = "none") -> bytes:
    """Spec §2–3: prefix · u32 header length · header · arrays; ``compress``: none, sized or streamed zstd."""
    header = {**header, "arrays": [[name, dtype, count] for name, dtype, _, count in arrays]}
    head = json.dumps(header, separators=(",", ":")).encode()
    payload = struct.pack("<I", len(head)) + head + b"".join(data for _, _, data, _ in arrays)
    flags = 0
    if compress != "none":
        flags = FLAG_ZSTD
        if compress == "sized":
            payload = zstandard.ZstdCompressor(level=3).compress(payload)
        else:  # what a streaming encoder writes: no content size in the frame header
            obj = zstandard.ZstdCompressor(level=3, write_content_size=False).compressobj()
            payload = obj.compress(payload) + obj.flush()
    return struct.pack("<4sBB", MAGIC, WIRE_VERSION, flags) + payload


@dataclass
class SpecExecution:
    """One execution's events, tracking each node's full context to send deltas and digests."""

    run_id: str
    task_id: str
    execution_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    seq: int = -1
    contexts: dict[str, list[int]] = field(default_factory=dict)
    records: list[tuple[bytes, bytes]] = field(default_factory=list)
    headers: list[dict[str, Any]] = field(default_factory=list)
    inputs: dict[str, list[int]] = field(default_factory=dict)
    compress: str = "none"

    def _emit(self, kind: str, fields: dict[str, Any], arrays: list[tuple[str, str, bytes, int]]) -> str:
        self.seq += 1
        event_id = str(uuid.uuid4())
        header = {"schema_version": 1, "kind": kind, "event_id": event_id, "execution_id": self.execution_id,
                  "seq": self.seq, "created_at": time.time(), "fields": fields}
        data = record(header, arrays, compress=self.compress)
        self.headers.append({**header, "arrays": [[n, d, c] for n, d, _, c in arrays]})
        self.records.append((data, self.execution_id.encode()))
        return event_id

    def start(self, vocab_size: int) -> None:
        self._emit("execution_started", {"run_id": self.run_id, "task_id": self.task_id, "engine": "spec",
                                         "vocab_size": vocab_size}, [])

    def prompt(self, ids: list[int], parent: str | None = None) -> str:
        eid = self._emit("prompt", {"parent": parent}, [("token_ids", "<i4", pack_ids(ids), len(ids))])
        node = node_id(eid, "node")
        self.contexts[node] = (self.contexts[parent] if parent else []) + ids
        return node

    def observe(self, parent: str, ids: list[int]) -> str:
        eid = self._emit("observation", {"parent": parent, "source": "tool"},
                         [("token_ids", "<i4", pack_ids(ids), len(ids))])
        node = node_id(eid, "node")
        self.contexts[node] = self.contexts[parent] + ids
        return node

    def call(self, parent: str | None, appended: list[int], output: list[int], logprobs: list[float], *,
             kind: str = "action", drift_at: int | None = None) -> str:
        """A model call; ``parent=None`` sends the full input in ``appended``; ``drift_at``: a checked call that
        drifted there (sent as ``drift_checked`` true and ``drift_at``). Returns the output node id."""
        full = (self.contexts[parent] if parent else []) + appended
        drift = {} if drift_at is None else {"drift_checked": True, "drift_at": drift_at}
        eid = self._emit("model_call", {"call_kind": kind, "parent": parent, "input_digest": input_digest(full),
                                        "policy_version": 0, "finish_reason": "stop", **drift},
                         [("appended", "<i4", pack_ids(appended), len(appended)),
                          ("output_ids", "<i4", pack_ids(output), len(output)),
                          ("output_logprobs", "<f4", pack_logprobs(logprobs), len(logprobs))])
        self.inputs[eid] = full
        out = node_id(eid, "output")
        self.contexts[out] = full + output
        return out

    def fork(self, at: str, branches: int) -> None:
        self._emit("fork", {"at_node": at, "branches": branches}, [])

    def compact(self, summary_node: str, context: list[int]) -> str:
        eid = self._emit("segment_boundary", {"from_node": summary_node},
                         [("token_ids", "<i4", pack_ids(context), len(context))])
        root = node_id(eid, "root")
        self.contexts[root] = context
        return root

    def score(self, value: float, revision: int) -> None:
        self._emit("partial_score", {"score": value, "components": {"tests": value}, "revision": revision}, [])

    def finish(self, reward: float, leaf: str) -> None:
        self._emit("execution_finished", {"status": "success", "reward": reward, "leaf_rewards": {leaf: reward}}, [])


def policy_published(run_id: str, version: int) -> tuple[bytes, dict[str, Any]]:
    header = {"schema_version": 1, "kind": "policy_published", "event_id": str(uuid.uuid4()), "execution_id": None,
              "seq": None, "created_at": time.time(), "fields": {"run_id": run_id, "version": version}}
    return record(header, []), {**header, "arrays": []}
