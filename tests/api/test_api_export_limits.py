"""Exports in bounded memory and on their own pool: a wide execution under a small bound, stalled downloads."""

from __future__ import annotations

import io
import socket
import struct
import time
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import sqlalchemy as sa
import uvicorn

from sapwood.api import ApiSettings, create_app
from sapwood.api.queries.export import ExportRows, ParquetExport
from sapwood.platform.execution_filter import ExecutionFilter
from sapwood.platform.store import Store
from sapwood.platform.synthetic import SynthConfig, synthetic_execution
from tests.support.api_client import make_keys
from tests.support.live_server import serve_in_thread

BOUND = 8 << 20
WIDE = SynthConfig(
    calls=160,
    forks=149,
    fork_depth=1,
    segments=1,
    obs_min=50,
    obs_max=300,
    out_min=20,
    out_max=100,
    system_tokens=500,
    task_tokens=100,
)


def _load_wide(store: Store, n: int = 1) -> None:
    for i in range(n):
        store.apply(synthetic_execution(SynthConfig(**{**WIDE.__dict__, "seed": i}), run_id="wide").events)


@pytest.fixture
def wide_sqlite(tmp_path: Path) -> Iterator[Store]:
    store = Store.open(f"sqlite:///{tmp_path / 'wide.db'}")
    _load_wide(store)
    yield store
    store.close()


def _export_peak(store: Store, rows: ExportRows, memory_bytes: int) -> tuple[int, bytes]:
    """(peak bytes: Python/numpy allocations + Arrow's pool, the file) of one export."""
    pool = pa.proxy_memory_pool(pa.system_memory_pool())
    previous = pa.default_memory_pool()
    pa.set_memory_pool(pool)
    tracemalloc.start()
    try:
        size = 0
        out = io.BytesIO()
        for chunk in ParquetExport(
            store.engine,
            ExecutionFilter(),
            rows=rows,
            limit=10,
            memory_bytes=memory_bytes,
        ).open():
            size += len(chunk)
            out.write(chunk)
        python_peak = tracemalloc.get_traced_memory()[1] - size  # the test's own copy of the file is not the export's
    finally:
        tracemalloc.stop()
        pa.set_memory_pool(previous)
    return python_peak + pool.max_memory(), out.getvalue()


@pytest.mark.parametrize("rows", ["trajectory", "node"])
def test_a_wide_execution_exports_under_a_small_memory_bound(wide_sqlite: Store, rows: ExportRows) -> None:
    _export_peak(wide_sqlite, rows, BOUND)  # first use: imports and statement caches, not per request
    peak, data = _export_peak(wide_sqlite, rows, BOUND)
    assert peak < BOUND, f"export peak {peak / 2**20:.1f} MiB above the {BOUND / 2**20:.0f} MiB bound"
    f = pq.ParquetFile(io.BytesIO(data))
    assert f.metadata.num_rows == (150 if rows == "trajectory" else 929)
    if rows == "trajectory":  # ~150 rows of ~30K tokens each: far more than the bound in all
        assert sum(f.read(columns=["n_tokens"]).column(0).to_pylist()) * 14 > 4 * BOUND
        assert f.metadata.num_row_groups > 4


@pytest.fixture
def pg_wide(pg_url: str) -> Iterator[Store]:
    store = Store.open(pg_url)
    _load_wide(store, 2)
    yield store
    store.close()


def _stalled_export(base: str, key: str) -> socket.socket:
    """An export request from a client with a tiny receive buffer that never reads."""
    host, port = base.removeprefix("http://").split(":")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect((host, int(port)))
    sock.sendall(f"GET /v1/export.parquet?limit=10 HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n\r\n".encode())
    return sock


def test_stalled_downloads_starve_nothing_and_are_dropped(pg_wide: Store) -> None:
    keys = make_keys(pg_wide)
    auth = {"Authorization": f"Bearer {keys.read}"}
    settings = ApiSettings(
        api_db_pool_size=2,
        api_db_max_overflow=0,
        api_db_pool_timeout_s=1.0,
        api_export_concurrency=3,
        api_export_pool_size=2,
        api_export_send_timeout_s=2.0,
    )
    app = create_app(settings, store=pg_wide)
    exports = app.state.sapwood.exports
    with serve_in_thread(app) as base, httpx.Client(base_url=base, timeout=30) as client:
        stalled = [_stalled_export(base, keys.read) for _ in range(8)]
        try:
            deadline = time.monotonic() + 30
            while exports.running < 3:  # the stalled downloads took every export slot
                assert time.monotonic() < deadline, "the stalled exports never started"
                time.sleep(0.05)
            for _ in range(5):
                assert client.get("/healthz").status_code == 200
                assert client.get("/v1/executions", headers=auth).status_code == 200
            busy = client.get("/v1/export.parquet", headers=auth)
            assert busy.status_code == 503, busy.text
            assert busy.headers["retry-after"]
            deadline = time.monotonic() + 60  # after the send timeout the slots are freed, with the clients still there
            while (r := client.get("/v1/export.parquet", headers=auth, params={"limit": 1})).status_code == 503:
                assert time.monotonic() < deadline, "stalled exports were never dropped"
                time.sleep(0.2)
            assert r.status_code == 200
            assert pq.ParquetFile(io.BytesIO(r.content)).metadata.num_rows == 150
        finally:
            for s in stalled:
                s.close()
    assert exports.running == 0


def _wait_for(what: str, condition: Callable[[], bool], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"{what} within {timeout_s} s"
        time.sleep(0.02)


DROPPED_EXPORT_EXECUTIONS = 6


@pytest.fixture
def pg_wider(pg_url: str) -> Iterator[Store]:
    store = Store.open(pg_url)
    _load_wide(store, DROPPED_EXPORT_EXECUTIONS)
    yield store
    store.close()


def test_a_client_that_drops_mid_download_frees_its_connections(pg_wider: Store) -> None:
    """The client resets its socket after the first bytes, long before the send timeout: its export
    slot, its database connection and the server's connection are all released, and the export stops
    reading (it does not run on into a closed socket)."""
    keys = make_keys(pg_wider)
    settings = ApiSettings(api_export_concurrency=2, api_export_pool_size=2, api_export_send_timeout_s=600.0)
    app = create_app(settings, store=pg_wider)
    exports = app.state.sapwood.exports
    checkouts: list[int] = []
    sa.event.listen(exports.engine, "checkout", lambda *_: checkouts.append(1))
    servers: list[uvicorn.Server] = []
    with serve_in_thread(app, servers=servers) as base:
        state = servers[0].server_state
        _wait_for("no connection before the test", lambda: len(state.connections) == 0)
        sock = _stalled_export(base, keys.read)
        try:
            assert sock.recv(12).startswith(b"HTTP/1.1 200")  # the download has started, and is not read on
            _wait_for("the export running", lambda: exports.running == 1)
            assert len(state.connections) == 1
        finally:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # drop (RST), mid-stream
            sock.close()
        _wait_for("the export's slot freed", lambda: exports.running == 0)
        _wait_for("its database connections returned", lambda: exports.engine.pool.checkedout() == 0)
        _wait_for("the server's connection closed", lambda: len(state.connections) == 0)
        assert app.state.sapwood.store.engine.pool.checkedout() == 0
        # one connection per execution read (and one per page of the listing): not all were read
        assert len(checkouts) < DROPPED_EXPORT_EXECUTIONS
