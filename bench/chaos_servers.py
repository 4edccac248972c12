"""The servers' side of the fault campaign (bench/chaos.py): a fresh PostgreSQL database, fresh Kafka
topics, terminating an ingest connection, waiting until the stored offsets reach the log end, and the
local broker restart of this checkout's test servers."""

from __future__ import annotations

import contextlib
import importlib.util
import time
import uuid
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import sqlalchemy as sa
from psycopg import sql
from sqlalchemy.engine import make_url

from sapwood.ingest.topics import end_offsets
from sapwood.platform.storage.backends import offset_store

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka import KafkaAdminClient

APP_NAME = "sapwood-chaos"
"""``application_name`` of the ingest processes' connections (what ``terminate_backend`` looks for)."""


def admin_params(url: str) -> dict[str, Any]:
    u = make_url(url)
    return {"host": u.host or "127.0.0.1", "port": u.port or 5432, "user": u.username or "postgres",
            "password": u.password, "dbname": u.database or "postgres"}


def fresh_database(server_url: str) -> tuple[str, Callable[[], None]]:
    """A new database on the server of ``server_url``: (its URL, a function dropping it)."""
    name = f"sapwood_chaos_{uuid.uuid4().hex[:10]}"
    admin = admin_params(server_url)
    with psycopg.connect(**admin, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))

    def drop() -> None:
        with psycopg.connect(**admin, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))

    return make_url(server_url).set(database=name).render_as_string(hide_password=False), drop


def terminate_backend(url: str) -> tuple[int, bool]:
    """Terminate one ingest connection of the database of ``url``, in a transaction when one is caught within
    3 s: (backends terminated, whether it was mid-transaction)."""
    params = admin_params(url)
    with psycopg.connect(**params, autocommit=True, application_name="sapwood-chaos-admin") as conn:
        deadline = time.monotonic() + 3.0
        while True:
            rows = conn.execute(
                "SELECT pid, xact_start IS NOT NULL FROM pg_stat_activity WHERE application_name = %s "
                "AND datname = %s ORDER BY (xact_start IS NOT NULL) DESC, random() LIMIT 1",
                (APP_NAME, params["dbname"])).fetchall()
            if rows and (rows[0][1] or time.monotonic() > deadline):
                pid, in_tx = rows[0]
                conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
                return 1, bool(in_tx)
            if not rows and time.monotonic() > deadline:
                return 0, False
            time.sleep(0.01)


def create_topics(bootstrap: str, topic: str, partitions: int) -> None:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, client_id="sapwood-chaos-admin")
    try:
        configs = {"max.message.bytes": str(2 * 1024 * 1024)}
        admin.create_topics({topic: {"num_partitions": partitions, "configs": configs},
                             f"{topic}.dlq": {"num_partitions": 1}}, wait_for_metadata=True)
    finally:
        admin.close()


def wait_applied(engine: sa.Engine, group: str, topic: str, ends: dict[int, int], timeout_s: float) -> float | None:
    """Seconds until the stored offsets reach ``ends`` (None on timeout)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        try:
            with engine.connect() as conn:
                stored = offset_store(conn).read(conn, group, topic)
            if all(stored.get(p, 0) >= e for p, e in ends.items() if e > 0):
                return time.monotonic() - t0
        except sa.exc.SQLAlchemyError:
            pass
        time.sleep(0.05)
    return None


def log_end_offsets(bootstrap: str, topic: str) -> dict[int, int]:
    for _ in range(60):
        with contextlib.suppress(Exception):
            return end_offsets(bootstrap, topic)
        time.sleep(1.0)
    raise RuntimeError("log-end offsets unavailable for 60 s")


def local_broker_restart() -> Callable[[], Any]:
    """``restart_kafka`` of this checkout's test servers (``tests/support/services.py``)."""
    path = Path(__file__).resolve().parents[1] / "tests" / "support" / "services.py"
    spec = importlib.util.spec_from_file_location("sapwood_chaos_services", path)
    if spec is None or spec.loader is None:
        raise RuntimeError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.restart_kafka
