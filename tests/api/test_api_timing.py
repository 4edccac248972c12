"""The opt-in per-request time split (``SAPWOOD_API_TIMING``: Server-Timing; ``SAPWOOD_API_TIMING_DIR``: JSON lines)."""

from __future__ import annotations

import gc
import json
from pathlib import Path

from sapwood.platform.store import Store
from sapwood.platform.writer import ExecutionWriter
from tests.support.api_client import Keys, calls_of, make_client


def _split(header: str) -> dict[str, float]:
    out = {}
    for part in header.split(", "):
        name, _, rest = part.partition(";")
        if rest.startswith("dur="):
            out[name] = float(rest[4:])
        else:
            out[name] = float(rest.split('"')[1])
    return out


def test_an_audit_answers_its_time_split(pg_store: Store, keys: Keys, writers: list[ExecutionWriter]) -> None:
    call_id = calls_of(writers[0])[-1].event_id
    with make_client(pg_store, api_cache_bytes=0, api_timing=True) as client:
        client.get(f"/v1/calls/{call_id}/audit", headers=keys.headers("read"))  # the key looked up and cached
        r = client.get(f"/v1/calls/{call_id}/audit", headers=keys.headers("read"))
    assert r.status_code == 200, r.text
    split = _split(r.headers["server-timing"])
    assert split["db_n"] == 1  # the audit's one statement, timed by the engine's events
    assert split["db"] > 0
    assert split["json"] > 0
    assert split["key"] > 0
    assert split["app"] >= split["db"] + split["json"]


def test_no_header_unless_asked(pg_store: Store, keys: Keys, writers: list[ExecutionWriter]) -> None:
    with make_client(pg_store, api_cache_bytes=0) as client:
        r = client.get(f"/v1/calls/{calls_of(writers[0])[0].event_id}/audit", headers=keys.headers("read"))
    assert r.status_code == 200
    assert "server-timing" not in r.headers


def test_the_log_holds_requests_gc_pauses_and_loop_lag(pg_store: Store, keys: Keys, writers: list[ExecutionWriter],
                                                        tmp_path: Path) -> None:
    with make_client(pg_store, api_cache_bytes=0, api_timing_dir=str(tmp_path)) as client:
        for call in calls_of(writers[0])[:3]:
            assert client.get(f"/v1/calls/{call.event_id}/audit", headers=keys.headers("read")).status_code == 200
        gc.collect()
        for _ in range(2_000):  # the lag sampler runs on the app's loop between requests; its lines are flushed
            if any(json.loads(x)["k"] == "lag" for x in _lines(tmp_path)):  # 5 times a second
                break
            client.get("/healthz")
    records = [json.loads(x) for x in _lines(tmp_path)]
    requests = [r for r in records if r["k"] == "req" and r["path"].endswith("/audit")]
    assert len(requests) == 3
    assert all(r["db_n"] >= 1 and r["status"] == 200 and r["bytes"] > 0 for r in requests)
    assert any(r["k"] == "gc" for r in records)
    assert any(r["k"] == "lag" and r["ms"] >= 0 for r in records)


def _lines(directory: Path) -> list[str]:
    return [line for f in directory.glob("api-timing-*.jsonl") for line in f.read_text().splitlines()]
