"""The store: one engine (:func:`~sapwood.platform.storage.engines.make_engine`), migrations, apply and reads."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from sqlalchemy.engine import Connection, Engine

from sapwood.platform.apply import ApplyResult, ContextCache, apply_events
from sapwood.platform.errors import ConflictError, StoreError
from sapwood.platform.events import Event
from sapwood.platform.phase_timer import PhaseTimer
from sapwood.platform.projection import projection_hash, rebuild_projections
from sapwood.platform.storage.backends import transactions, tree_reader
from sapwood.platform.storage.calls import output_digests
from sapwood.platform.storage.drift import RunDrift, drift_by_run
from sapwood.platform.storage.engines import make_engine
from sapwood.platform.storage.errors import lost_write_race, translate_errors
from sapwood.platform.storage.spans import load_spans
from sapwood.platform.storage.store_stats import finished_executions, store_counts
from sapwood.platform.tokens import FloatArray, TokenArray, unpack_logprobs, unpack_tokens


def migrations_dir() -> Path:
    """The Alembic scripts: the repository's ``migrations/`` or the copy packaged in the wheel."""
    here = Path(__file__).resolve()
    repo = here.parents[4] / "migrations"
    return repo if (repo / "env.py").exists() else here.parent / "_migrations"


class Store:
    """Event store + projections behind one engine; every public method translates driver errors."""

    def __init__(self, engine: Engine, *, cache_nodes: int = 200_000) -> None:
        self.engine = engine
        self.cache = ContextCache(cache_nodes)

    @classmethod
    def open(cls, url: str, *, migrate: bool = True, **engine_kw: Any) -> Store:
        store = cls(make_engine(url, **engine_kw))
        if migrate:
            store.migrate()
        return store

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    def close(self) -> None:
        self.engine.dispose()

    # -- schema ----------------------------------------------------------------------------------------
    def _alembic(self, conn: Connection) -> Any:
        from alembic.config import Config

        cfg = Config()
        cfg.set_main_option("script_location", str(migrations_dir()))
        cfg.attributes["connection"] = conn
        return cfg

    def migrate(self, revision: str = "head") -> None:
        from alembic import command

        with translate_errors(), self.engine.begin() as conn:
            transactions(conn).serialize_migrations(conn)  # processes started at once upgrade one by one
            command.upgrade(self._alembic(conn), revision)

    def downgrade(self, revision: str) -> None:
        from alembic import command

        with translate_errors(), self.engine.begin() as conn:
            command.downgrade(self._alembic(conn), revision)

    def current_revision(self) -> str | None:
        from alembic.runtime.migration import MigrationContext

        with translate_errors(), self.engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()

    # -- writes ----------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def transaction(self) -> Iterator[Connection]:
        with translate_errors(), self.engine.begin() as conn:
            yield conn

    def apply(self, events: Sequence[Event], *, strict: bool = True, retries: int = 3,
              timer: PhaseTimer | None = None) -> ApplyResult:
        """Apply ``events`` in one transaction (see :func:`apply_events`); retried on write races.
        ``timer`` receives the phase seconds of every attempt."""
        for attempt in range(retries + 1):
            try:
                with self.transaction() as conn:
                    result = apply_events(conn, events, cache=self.cache, strict=strict, timer=timer)
            except ConflictError as exc:
                if lost_write_race(exc) and attempt < retries:
                    continue  # a concurrent writer stored the same span/event first; re-plan
                raise
            self.cache.merge(result.new_states)
            return result
        raise AssertionError("unreachable")

    def rebuild_projections(self) -> int:
        with self.transaction() as conn:
            n = rebuild_projections(conn)
        self.cache = ContextCache(self.cache.max_nodes)
        return n

    # -- reads -----------------------------------------------------------------------------------------
    def projection_hash(self) -> str:
        with self.transaction() as conn:
            return projection_hash(conn)

    def reconstruct_input(self, call_id: str) -> TokenArray:
        """The exact input ids of model call ``call_id``, rebuilt from the tree."""
        with self.transaction() as conn:
            ids, recorded = tree_reader(conn).call_input(conn, call_id)
        if ids.size != recorded:
            raise StoreError(f"call {call_id}: reconstructed {ids.size} tokens, recorded {recorded}")
        return ids

    def call_output(self, call_id: str) -> tuple[TokenArray, FloatArray]:
        """Output ids [n] and rollout log-probs [n] of model call ``call_id``."""
        with self.transaction() as conn:
            tokens_digest, logprobs_digest = output_digests(conn, call_id)
            spans = load_spans(conn, [tokens_digest, logprobs_digest])
        return unpack_tokens(spans[tokens_digest]), unpack_logprobs(spans[logprobs_digest])

    def stats(self) -> dict[str, Any]:
        """Store-wide counts; ``dedup_ratio`` = tokens a naive per-call store would hold ÷ tree tokens."""
        with self.transaction() as conn:
            counts = store_counts(conn)
        naive = counts.call_input_tokens + counts.call_output_tokens
        return {
            "events": counts.events,
            "executions": counts.executions_by_status,
            "calls": counts.calls,
            "nodes": counts.nodes,
            "fork_points": counts.fork_points,
            "compactions": counts.compactions,
            "tree_tokens": counts.tree_tokens,
            "naive_tokens": naive,
            "dedup_ratio": round(naive / counts.tree_tokens, 3) if counts.tree_tokens else None,
            "span_rows": counts.span_rows,
            "span_bytes": counts.span_bytes,
        }

    def drift(self, run_id: str | None = None) -> list[RunDrift]:
        """Retokenization drift per run (every run with calls, or only ``run_id``): checked, drifted, rate."""
        with self.transaction() as conn:
            return drift_by_run(conn, run_id)

    def finished_executions(self, run_id: str) -> int:
        """How many executions of ``run_id`` have finished (status success, timeout or error)."""
        with self.transaction() as conn:
            return finished_executions(conn, run_id)
