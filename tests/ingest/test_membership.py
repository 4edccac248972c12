"""Static group membership ids: derived from the host and the lowest free index, stable across restarts."""

from __future__ import annotations

import socket
import subprocess
import sys
import textwrap
import urllib.request
from pathlib import Path

import pytest

from sapwood.ingest import IngestConfig
from sapwood.ingest.membership import derive_instance_id, resolve_instance_id
from sapwood.ingest.metrics import IngestMetrics
from sapwood.ingest.source import consumer_settings
from sapwood.platform.settings import Settings


def test_processes_on_one_host_take_the_lowest_free_indices(tmp_path: Path) -> None:
    a = derive_instance_id("g", host="box", directory=tmp_path)
    b = derive_instance_id("g", host="box", directory=tmp_path)
    other_group = derive_instance_id("h", host="box", directory=tmp_path)
    assert (a.value, b.value, other_group.value) == ("sapwood-ingest-box-0", "sapwood-ingest-box-1",
                                                      "sapwood-ingest-box-0")
    a.release()
    again = derive_instance_id("g", host="box", directory=tmp_path)
    assert again.value == "sapwood-ingest-box-0", "a restarted process gets its old index back"
    for lock in (b, other_group, again):
        lock.release()


def test_a_killed_process_frees_its_index(tmp_path: Path) -> None:
    child = textwrap.dedent(f"""
        import sys, time
        from pathlib import Path
        from sapwood.ingest.membership import derive_instance_id
        lock = derive_instance_id("g", host="box", directory=Path({str(tmp_path)!r}))
        print(lock.value, flush=True)
        time.sleep(60)
    """)
    proc = subprocess.Popen([sys.executable, "-c", child], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "sapwood-ingest-box-0"
        held = derive_instance_id("g", host="box", directory=tmp_path)
        assert held.value == "sapwood-ingest-box-1"
        held.release()
    finally:
        proc.kill()
        proc.wait(10)
    after = derive_instance_id("g", host="box", directory=tmp_path)
    assert after.value == "sapwood-ingest-box-0", "SIGKILL released the lock"
    after.release()


@pytest.mark.parametrize(("configured", "expected"), [(None, None), ("none", None), ("", None),
                                                      ("ingest-7", "ingest-7")])
def test_configured_ids(configured: str | None, expected: str | None) -> None:
    lock = resolve_instance_id(configured, "g")
    assert (lock.value if lock else None) == expected
    cfg = IngestConfig(database_url="sqlite://", bootstrap="b:9092", instance_id=configured)
    assert consumer_settings(cfg, "c")["group_instance_id"] == expected


def test_settings_default_to_a_derived_static_id(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SAPWOOD_KAFKA_BOOTSTRAP", "broker:9092")
    cfg = IngestConfig.from_settings(Settings())
    assert cfg.instance_id == "auto"
    assert cfg.metrics_addr == "127.0.0.1"
    lock = resolve_instance_id(cfg.instance_id, cfg.group)
    assert lock is not None
    assert lock.value.startswith(f"sapwood-ingest-{socket.gethostname()}"[:40])
    lock.release()


def test_metrics_listen_on_loopback_unless_configured() -> None:
    metrics = IngestMetrics()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    metrics.serve(port)
    try:
        assert metrics._server.server_address[0] == "127.0.0.1"
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
            assert b"sapwood_ingest_events_total" in resp.read()
    finally:
        metrics.close()
