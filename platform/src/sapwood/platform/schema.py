"""SQLAlchemy 2 tables of the store (one metadata for SQLite and PostgreSQL).

Git-like layout: ``spans`` is the content-addressed object store (packed token ids or
log-probs, stored once), ``events`` the append-only log referencing spans, and every other
table a projection derived from events (droppable and rebuildable, see :mod:`projection`).
"""

from __future__ import annotations

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Column,
    Float,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    SmallInteger,
    String,
    Table,
    UniqueConstraint,
    Uuid,
    false,
)
from sqlalchemy.dialects import postgresql

metadata = MetaData(
    naming_convention={
        "ix": "ix_%(column_0_label)s",
        "uq": "uq_%(table_name)s_%(column_0_name)s",
        "pk": "pk_%(table_name)s",
    }
)

#: JSONB on PostgreSQL, JSON text on SQLite.
Json = JSON().with_variant(postgresql.JSONB(), "postgresql")
#: JSON text on both (PostgreSQL ``json``): for documents kept as recorded and only ever read whole —
#: no parse into JSONB's binary form on every insert.
RecordJson = JSON()
#: 64-bit autoincrement key that SQLite also accepts (INTEGER PRIMARY KEY).
BigId = BigInteger().with_variant(Integer(), "sqlite")
#: UUIDs: native ``uuid`` on PostgreSQL (16 B), 32-char hex on SQLite; Python sees strings.
Id = Uuid(as_uuid=False)

# ``nodes.role`` holds a :class:`sapwood.platform.tree.Role` code.

events = Table(
    "events",
    metadata,
    Column("pos", BigId, primary_key=True, autoincrement=True, comment="global append order"),
    Column("event_id", Id, nullable=False, unique=True),
    Column("execution_id", Id, nullable=True),
    Column("seq", Integer, nullable=True),
    Column("kind", String(32), nullable=False),
    Column("schema_version", SmallInteger, nullable=False),
    Column("created_at", Float, nullable=False, comment="producer clock, unix seconds"),
    Column("body", RecordJson, nullable=False, comment="scalar fields; arrays as [span digest hex, count]"),
    Column("content_digest", LargeBinary(16), nullable=True,
           comment="BLAKE2b-128 of the canonical content (NULL before revision 0008)"),
    UniqueConstraint("execution_id", "seq", name="uq_events_execution_seq"),
)

spans = Table(
    "spans",
    metadata,
    Column("digest", LargeBinary(16), primary_key=True, comment="BLAKE2b-128 of the canonical bytes"),
    Column("encoding", SmallInteger, nullable=False, server_default="0",
           comment="0 canonical bytes, 1 uint16 ids, 2 3-byte ids, 3 uint16 + high bits (see span_encoding)"),
    Column("data", LargeBinary, nullable=False, comment="the span's bytes in its encoding"),
)

executions = Table(
    "executions",
    metadata,
    Column("execution_id", Id, primary_key=True),
    Column("run_id", String(128), nullable=False, index=True),
    Column("task_id", String(256), nullable=False, index=True),
    Column("task_family", String(64), nullable=False),
    Column("engine", String(128), nullable=False),
    Column("sampling_params", Json, nullable=False),
    Column("vocab_size", Integer, nullable=True),
    Column("metadata", Json, nullable=False),
    Column("status", String(16), nullable=False, index=True, comment="running/success/timeout/error"),
    Column("reward", Float, nullable=True),
    Column("leaf_rewards", Json, nullable=False),
    Column("message", String, nullable=False),
    Column("started_at", Float, nullable=False, index=True),
    Column("finished_at", Float, nullable=True),
    Column("last_seq", Integer, nullable=False),
    Column("n_nodes", Integer, nullable=False),
    Column("n_tokens", BigInteger, nullable=False, comment="tokens in the tree (shared prefixes once)"),
    Column("n_input_tokens", BigInteger, nullable=False, comment="sum of call input lengths"),
    Column("n_output_tokens", BigInteger, nullable=False),
    Column("n_calls", Integer, nullable=False),
    Column("n_forks", Integer, nullable=False),
    Column("n_segments", Integer, nullable=False),
    Column("max_policy_version", Integer, nullable=True),
    Column("score", Float, nullable=True, comment="latest partial score"),
    Column("score_revision", Integer, nullable=True),
)

nodes = Table(
    "nodes",
    metadata,
    Column("node_id", Id, primary_key=True),
    Column("execution_id", Id, nullable=False, index=True),
    Column("parent_id", Id, nullable=True, index=True, comment="previous node of the same context"),
    Column("prev_segment_node", Id, nullable=True, comment="segment root: the summary it continues"),
    Column("role", SmallInteger, nullable=False),
    Column("span_digest", LargeBinary(16), nullable=False),
    Column("length", Integer, nullable=False, comment="tokens in this node"),
    Column("depth", Integer, nullable=False, comment="token offset of the node's first token in its context"),
    Column("segment", Integer, nullable=False),
    Column("is_leaf", Boolean, nullable=False),
    Column("fork_branches", Integer, nullable=False, comment="0 unless a fork event names this node"),
    Column("call_id", Id, nullable=True, comment="model call that produced this node"),
    Column("policy_version", Integer, nullable=True),
    Column("seq", Integer, nullable=False, comment="seq of the creating event"),
)

calls = Table(
    "calls",
    metadata,
    Column("call_id", Id, primary_key=True),
    Column("execution_id", Id, nullable=False, index=True),
    Column("seq", Integer, nullable=False),
    Column("call_kind", String(8), nullable=False),
    Column("segment", Integer, nullable=False),
    Column("input_node", Id, nullable=False, comment="last node of the input path"),
    Column("input_len", Integer, nullable=False),
    Column("input_digest", String(32), nullable=False),
    Column("output_node", Id, nullable=False),
    Column("n_output", Integer, nullable=False),
    Column("logprobs_digest", LargeBinary(16), nullable=False),
    Column("policy_version", Integer, nullable=False),
    Column("finish_reason", String(32), nullable=False),
    Column("timings", RecordJson, nullable=False),
    Column("sampling_params", RecordJson, nullable=True),
    Column("created_at", Float, nullable=False),
    Column("drift_checked", Boolean, nullable=False, server_default=false(),
           comment="the input continued the previous chat call's context (retokenization drift checked)"),
    Column("drift_at", Integer, nullable=True,
           comment="index in the input of the first id differing from the previous call's output; null: none"),
)
Index("ix_calls_input_node", calls.c.input_node)

segments = Table(
    "segments",
    metadata,
    Column("root_node", Id, primary_key=True),
    Column("execution_id", Id, nullable=False, index=True),
    Column("segment", Integer, nullable=False),
    Column("from_node", Id, nullable=False),
    Column("seq", Integer, nullable=False),
)

scores = Table(
    "scores",
    metadata,
    Column("event_id", Id, primary_key=True),
    Column("execution_id", Id, nullable=False),
    Column("revision", Integer, nullable=False),
    Column("score", Float, nullable=False),
    Column("components", Json, nullable=False),
    Column("scorer", String(128), nullable=False),
    Column("note", String, nullable=False),
    Column("created_at", Float, nullable=False),
    UniqueConstraint("execution_id", "revision", name="uq_scores_execution_revision"),
)

policy_versions = Table(
    "policy_versions",
    metadata,
    Column("run_id", String(128), primary_key=True),
    Column("version", Integer, primary_key=True),
    Column("event_id", Id, nullable=False),
    Column("checkpoint", String, nullable=False),
    Column("metadata", Json, nullable=False),
    Column("published_at", Float, nullable=False),
)

dead_letters = Table(
    "dead_letters",
    metadata,
    Column("id", BigId, primary_key=True, autoincrement=True),
    Column("received_at", Float, nullable=False),
    Column("reason", String(32), nullable=False),
    Column("message", String, nullable=False),
    Column("event_id", Id, nullable=True),
    Column("execution_id", Id, nullable=True),
    Column("source", String(256), nullable=False, comment="e.g. kafka:topic/partition@offset"),
    Column("payload", LargeBinary, nullable=False, comment="the original bytes"),
    Column("record_key", LargeBinary, nullable=True, comment="Kafka record key (the execution id for TITO events)"),
)

consumer_offsets = Table(
    "consumer_offsets",
    metadata,
    Column("group_id", String(128), primary_key=True),
    Column("topic", String(256), primary_key=True),
    Column("partition", Integer, primary_key=True),
    Column("next_offset", BigInteger, nullable=False),
    Column("updated_at", Float, nullable=False),
)

runs = Table(
    "runs",
    metadata,
    Column("run_id", String(128), primary_key=True),
    Column("kind", String(16), nullable=False, comment="live (follows new executions) or replay (fixed history)"),
    Column("filter", Json, nullable=False, comment="ExecutionFilter selecting what the run consumes"),
    Column("seed", Integer, nullable=False, comment="order of a replay run"),
    Column("config", Json, nullable=False),
    Column("description", String, nullable=False),
    Column("created_at", Float, nullable=False),
)

run_items = Table(
    "run_items",
    metadata,
    Column("run_id", String(128), primary_key=True),
    Column("execution_id", Id, primary_key=True),
    Column("order_key", BigInteger, nullable=False),
    Column("state", String(8), nullable=False, comment="pending / claimed / done"),
    Column("claimed_by", String(128), nullable=True),
    Column("lease_until", Float, nullable=True),
    Column("attempts", Integer, nullable=False),
    Column("done_at", Float, nullable=True),
    Index("ix_run_items_queue", "run_id", "state", "order_key"),
)

prompts = Table(
    "prompts",
    metadata,
    Column("run_id", String(128), primary_key=True),
    Column("prompt_index", Integer, primary_key=True, comment="row of the dataset the prompt came from"),
    Column("prompt", Json, nullable=False, comment="text, or a list of chat messages {role, content}"),
    Column("task_id", String(256), nullable=False),
    Column("task_family", String(128), nullable=False),
    Column("metadata", Json, nullable=False),
)

prompt_samples = Table(
    "prompt_samples",
    metadata,
    Column("run_id", String(128), primary_key=True),
    Column("sample_id", String(64), primary_key=True, comment="'{prompt_index}:{epoch}:{sample}'"),
    Column("prompt_index", Integer, nullable=False),
    Column("epoch", Integer, nullable=False),
    Column("order_key", BigInteger, nullable=False),
    Column("state", String(8), nullable=False, comment="pending / claimed / done"),
    Column("claimed_by", String(128), nullable=True),
    Column("lease_until", Float, nullable=True),
    Column("attempts", Integer, nullable=False),
    Column("done_at", Float, nullable=True),
    Column("execution_id", Id, nullable=True, comment="the execution of the current attempt"),
    Index("ix_prompt_samples_queue", "run_id", "state", "order_key"),
)

prompt_attempts = Table(
    "prompt_attempts",
    metadata,
    Column("execution_id", Id, primary_key=True),
    Column("run_id", String(128), nullable=False),
    Column("sample_id", String(64), nullable=False),
    Column("worker", String(128), nullable=False),
    Column("started_at", Float, nullable=False),
    Column("state", String(9), nullable=False, comment="recording / finished / abandoned (never trained)"),
    Index("ix_prompt_attempts_sample", "run_id", "sample_id"),
)

api_keys = Table(
    "api_keys",
    metadata,
    Column("key_id", String(32), primary_key=True, comment="public part of the key"),
    Column("name", String(128), nullable=False),
    Column("secret_hash", LargeBinary(32), nullable=False, comment="SHA-256 of the secret part"),
    Column("scopes", String(64), nullable=False, comment="space-separated: read write admin"),
    Column("created_at", Float, nullable=False),
    Column("revoked", Boolean, nullable=False),
)

idempotency_keys = Table(
    "idempotency_keys",
    metadata,
    Column("principal", String(32), primary_key=True, comment="key_id of the API key that sent the request"),
    Column("idempotency_key", String(128), primary_key=True, comment="the Idempotency-Key header"),
    Column("route", String(300), nullable=False, comment="method and path of the first request"),
    Column("request_digest", LargeBinary(32), nullable=False,
           comment="SHA-256 of method, path and the canonical JSON of the validated body"),
    Column("status", Integer, nullable=False, comment="HTTP status of the stored answer"),
    Column("body", LargeBinary, nullable=False, comment="JSON body of the stored answer"),
    Column("created_at", Float, nullable=False),
)

cells = Table(
    "cells",
    metadata,
    Column("cell_id", String(128), primary_key=True),
    Column("tier", String(16), nullable=False, comment="core (holds parameters) or satellite"),
    Column("capacity", Integer, nullable=False, comment="concurrent rollouts in the rollout role"),
    Column("role", String(16), nullable=False, comment="rollout / train / idle (the last role assigned)"),
    Column("role_since", Float, nullable=False),
    Column("registered_at", Float, nullable=False),
    Column("last_heartbeat_at", Float, nullable=False),
    Column("heartbeats", BigInteger, nullable=False),
    Column("role_changes", Integer, nullable=False),
    Column("switch_s", Float, nullable=False, comment="sum of switch phase durations"),
    Column("last_phase", String(64), nullable=True),
    Column("metadata", Json, nullable=False),
)

scheduler_decisions = Table(
    "scheduler_decisions",
    metadata,
    Column("event_id", Id, primary_key=True),
    Column("cell_id", String(128), nullable=False, index=True),
    Column("role", String(16), nullable=False),
    Column("previous_role", String(16), nullable=False),
    Column("reason", String, nullable=False),
    Column("policy", String(256), nullable=False),
    Column("signals", Json, nullable=False, comment="the signal snapshot the decision was made on"),
    Column("decided_at", Float, nullable=False),
    Index("ix_scheduler_decisions_time", "decided_at", "event_id"),
)

switch_phases = Table(
    "switch_phases",
    metadata,
    Column("event_id", Id, primary_key=True),
    Column("cell_id", String(128), nullable=False, index=True),
    Column("role", String(16), nullable=False),
    Column("phase", String(64), nullable=False),
    Column("duration_s", Float, nullable=False),
    Column("at", Float, nullable=False),
)


#: Tables derived from events; dropped and rebuilt by ``rebuild_projections``.
PROJECTION_TABLES = (
    executions, nodes, calls, segments, scores, policy_versions, cells, scheduler_decisions, switch_phases,
)
