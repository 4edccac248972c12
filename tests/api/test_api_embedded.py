"""The embedded case (SQLite file store), the CLI commands, and ingest lag against a real Kafka broker."""

from __future__ import annotations

import io
import signal
import socket
import subprocess
import sys
import time
import warnings
from pathlib import Path

import httpx
import pyarrow.parquet as pq
import typer
from typer.testing import CliRunner

from sapwood.api.cli import register
from sapwood.platform import schema as t
from sapwood.platform.store import Store
from tests.support.api_client import calls_of, load_executions, make_client, make_keys, recorded_input


def test_sqlite_store_serves_every_kind_of_request(tmp_path: Path) -> None:
    store = Store.open(f"sqlite:///{tmp_path / 'sapwood.db'}")
    writers = load_executions(store, 2)
    keys = make_keys(store)
    h = keys.headers("all")
    w = writers[1]
    with make_client(store) as c:
        page = c.get("/v1/executions", headers=h, params={"limit": 1}).json()
        page2 = c.get("/v1/executions", headers=h, params={"limit": 1, "cursor": page["next_cursor"]}).json()
        assert [page["items"][0]["execution_id"], page2["items"][0]["execution_id"]] == [writers[1].execution_id,
                                                                                       writers[0].execution_id]
        tree = c.get(f"/v1/executions/{w.execution_id}/tree", headers=h).json()
        assert len(tree["nodes"]) == len(w.nodes)
        assert set(tree["leaves"]) == set(w.leaves())
        assert c.get(f"/v1/executions/{w.execution_id}/tree/summary", headers=h).status_code == 200
        call = calls_of(w)[-1]
        audit = c.get(f"/v1/calls/{call.event_id}/audit", headers=h).json()
        assert audit["verified"]
        assert audit["input"]["token_ids"] == recorded_input(w, call).tolist()
        seen = c.get(f"/v1/nodes/{w.leaves()[0]}/trajectory", headers=h).json()
        assert seen["n_tokens"] > 0
        root = tree["nodes"][0]["node_id"]
        assert c.get(f"/v1/nodes/{root}/calls", headers=h).json()["items"]
        run = c.post("/v1/runs", headers=h, json={"run_id": "replay", "seed": 2}).json()
        assert run["queued"] == 2
        assert c.post(f"/v1/executions/{w.execution_id}/scores", headers=h, json={"score": 0.5}).status_code == 201
        table = pq.read_table(io.BytesIO(c.get("/v1/export.parquet", headers=h).content))
        assert table.num_rows == sum(len(x.leaves()) for x in writers)
        stats = c.get("/v1/stats", headers=h).json()
        assert stats["calls"] == sum(len(calls_of(x)) for x in writers)
        assert c.get("/healthz").json()["database"] == "sqlite"
    store.close()


def _cli() -> typer.Typer:
    app = typer.Typer()
    register(app)
    return app


def test_cli_creates_a_key_that_the_api_accepts(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    runner = CliRunner()
    result = runner.invoke(_cli(), ["keys", "create", "--name", "ops", "--scopes", "read write", "--database-url", url])
    assert result.exit_code == 0, result.output
    key = result.stdout.strip().splitlines()[0]
    key_id = key.split(".")[0]
    store = Store.open(url)
    with make_client(store) as c:
        assert c.get("/v1/runs", headers={"X-API-Key": key}).status_code == 200
        assert c.get("/v1/keys", headers={"X-API-Key": key}).status_code == 403
    listed = runner.invoke(_cli(), ["keys", "list", "--database-url", url])
    assert key_id in listed.stdout
    assert key.split(".")[1] not in listed.stdout
    assert runner.invoke(_cli(), ["keys", "revoke", key_id, "--database-url", url]).exit_code == 0
    with make_client(store) as c:
        assert c.get("/v1/runs", headers={"X-API-Key": key}).status_code == 401
    bad = runner.invoke(_cli(), ["keys", "create", "--name", "x", "--scopes", "root", "--database-url", url])
    assert bad.exit_code != 0
    store.close()


def test_serve_is_registered_into_the_sapwood_command() -> None:
    from sapwood.platform.cli import app

    result = CliRunner().invoke(app, ["serve", "--help"])
    assert result.exit_code == 0
    assert "--workers" in result.stdout
    assert CliRunner().invoke(app, ["keys", "--help"]).exit_code == 0


def test_ingest_lag_from_a_real_broker(pg_store: Store, kafka_bootstrap: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from kafka import KafkaProducer

    topic = f"sapwood-lag-{int(time.time() * 1000)}"
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap)
    for i in range(7):
        producer.send(topic, value=f"event {i}".encode(), partition=0)
    producer.flush()
    producer.close()
    with pg_store.transaction() as conn:
        conn.execute(t.consumer_offsets.insert().values(group_id="sapwood-ingest", topic=topic, partition=0,
                                                        next_offset=3, updated_at=time.time()))
    keys = make_keys(pg_store)
    with make_client(pg_store, kafka_bootstrap=kafka_bootstrap) as c:
        stats = c.get("/v1/stats", headers=keys.headers("read")).json()
    assert stats["ingest_lag"] == 4
    assert stats["ingest_lag_reason"] is None
    [part] = stats["ingest_lag_partitions"]
    assert (part["topic"], part["next_offset"], part["end_offset"], part["lag"]) == (topic, 3, 7, 4)


def test_listen_socket_sets_tcp_nodelay_for_accepted_connections() -> None:
    from sapwood.api.cli import listen_socket

    server = listen_socket("127.0.0.1", 0)
    client = socket.create_connection(server.getsockname())
    accepted, _ = server.accept()
    try:
        assert accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
    finally:
        for s in (accepted, client, server):
            s.close()


def test_sapwood_serve_with_two_workers(pg_url: str) -> None:
    store = Store.open(pg_url)
    key = make_keys(store).read
    store.close()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-c", "from sapwood.platform.cli import main; main()", "serve", "--database-url", pg_url,
           "--port", str(port), "--workers", "2", "--log-level", "warning"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"{base}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
            assert time.monotonic() < deadline, "sapwood serve did not become healthy"
            time.sleep(0.3)
        with httpx.Client(base_url=base, headers={"X-API-Key": key}) as c:
            assert all(c.get("/v1/runs").status_code == 200 for _ in range(20))
            assert c.get("/v1/keys").status_code == 403
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
