"""Liveness that tells the truth: ``/healthz`` flips on a stalled partition or a stuck main loop, the
watchdog exits with its own status, and SIGTERM ends a stuck process within its bound.

The stuck main loop is injected, not raced: a driver script replaces ``IngestService.step`` so that from
its third call on it blocks on an event nobody sets (as a wedged C call would), after writing a marker."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from sapwood.ingest.liveness import EXIT_STOP_TIMEOUT, EXIT_WEDGED, Liveness
from tests.support.kafka_ingest import create_topic, wait_until
from tests.support.live_server import free_port


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_partition_with_lag_and_no_progress_is_unhealthy_after_the_bound_not_before() -> None:
    clock = FakeClock()
    live = Liveness(5.0, clock=clock)
    live.observe(0, 10, 3)
    live.observe(1, 7, 0)
    clock.now += 5.0
    live.beat()
    live.observe(0, 10, 3)  # same position: no progress
    assert live.health() == (True, [])  # exactly the bound: still healthy
    clock.now += 0.5
    live.beat()
    live.observe(1, 7, 0)  # caught up: nothing to read is not a stall
    healthy, reasons = live.health()
    assert not healthy
    assert reasons == ["partition 0: lag 3, no progress for 5.5 s (bound 5.0 s)"]
    assert live.seconds_since_progress(0) == 5.5
    assert live.seconds_since_progress(1) == 0.0
    live.observe(0, 11, 2)  # moved
    assert live.health() == (True, [])


def test_a_main_loop_without_steps_is_unhealthy() -> None:
    clock = FakeClock()
    live = Liveness(2.0, clock=clock)
    clock.now += 2.5
    assert live.health() == (False, ["main loop: no step for 2.5 s (bound 2.0 s)"])
    live.beat()
    assert live.health() == (True, [])


def test_bounds_must_be_positive() -> None:
    with pytest.raises(ValueError, match="stall_after_s must be > 0"):
        Liveness(0)


DRIVER = """
import sys, threading
from pathlib import Path
from sapwood.ingest.service import IngestService
from sapwood.ingest.cli import main

real_step = IngestService.step
calls = []

def stuck_step(self):
    calls.append(1)
    if len(calls) < 3:
        return real_step(self)
    Path(marker).write_text("stuck")
    threading.Event().wait()  # the injected wedge: nothing ever sets it

IngestService.step = stuck_step
marker = sys.argv.pop(1)
main()
"""


def _start(tmp_path: Path, pg_url: str, kafka_bootstrap: str, port: int, *extra: str) -> subprocess.Popen[bytes]:
    driver = tmp_path / "driver.py"
    driver.write_text(textwrap.dedent(DRIVER))
    topic = create_topic(kafka_bootstrap, 1)
    args = [
        sys.executable,
        str(driver),
        str(tmp_path / "stuck"),
        "--database-url",
        pg_url,
        "--bootstrap",
        kafka_bootstrap,
        "--topic",
        topic,
        "--group",
        f"g-{topic}",
        "--partitions",
        "0",
        "--instance-id",
        "none",
        "--dead-letter-topic",
        f"{topic}.dlq",
        "--metrics-port",
        str(port),
        *extra,
    ]
    log = (tmp_path / "ingest.log").open("wb")
    return subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=os.environ.copy())


@contextmanager
def _wedged_ingest(
    tmp_path: Path, pg_url: str, kafka_bootstrap: str, *flags: str
) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """An ingest process whose main loop has reached the injected wedge; killed on the way out if still alive."""
    port = free_port()
    proc = _start(tmp_path, pg_url, kafka_bootstrap, port, *flags)
    try:
        wait_until(lambda: (tmp_path / "stuck").exists(), 90, "the main loop to reach the injected wedge")
        yield proc, port
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _health(port: int) -> tuple[int, dict[str, object]] | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())
    except OSError:
        return None


@pytest.mark.postgres
def test_a_stuck_main_loop_flips_healthz_and_the_watchdog_exits_with_its_status(
    pg_url: str, kafka_bootstrap: str, tmp_path: Path
) -> None:
    with _wedged_ingest(tmp_path, pg_url, kafka_bootstrap, "--stall-after-s", "1", "--watchdog-s", "4") as (proc, port):
        seen = wait_until(lambda: (h := _health(port)) is not None and h[0] == 503 and h, 10, "/healthz to answer 503")
        assert seen[1]["status"] == "unhealthy"
        assert any("main loop: no step" in r for r in seen[1]["reasons"])
        assert proc.wait(30) == EXIT_WEDGED, (tmp_path / "ingest.log").read_text()
        assert "watchdog: the ingest main loop took no step" in (tmp_path / "ingest.log").read_text()


@pytest.mark.postgres
def test_sigterm_during_a_stuck_batch_ends_the_process_within_the_bound(
    pg_url: str, kafka_bootstrap: str, tmp_path: Path
) -> None:
    flags = ("--watchdog-s", "600", "--stop-timeout-s", "2")
    with _wedged_ingest(tmp_path, pg_url, kafka_bootstrap, *flags) as (proc, port):
        assert _health(port) is not None  # the health server's thread runs: SIGTERM must not kill it by default
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(20)
        elapsed = time.monotonic() - t0
        assert rc == EXIT_STOP_TIMEOUT, (tmp_path / "ingest.log").read_text()
        assert 2.0 <= elapsed < 10.0
        assert "stop: not ended 2.0 s after signal" in (tmp_path / "ingest.log").read_text()


def test_the_sensor_feeds_progress_to_healthz_and_the_seconds_since_progress_gauge() -> None:
    from sapwood.ingest.metrics import IngestSensor
    from sapwood.ingest.source import TopicPartition

    clock = FakeClock()
    live = Liveness(3.0, clock=clock)
    sensor = IngestSensor(liveness=live)
    tp = TopicPartition("t", 4)
    sensor.report_lag({tp: 10}, lambda tps: {tp: 15}, force=True)
    port = free_port()
    sensor.serve(port, "127.0.0.1")
    try:
        clock.now += 4.0
        live.beat()
        sensor.report_lag({tp: 10}, lambda tps: {tp: 15}, force=True)  # lag 5, offset unmoved
        status, body = _health(port) or (0, {})
        assert status == 503
        assert body["reasons"] == ["partition 4: lag 5, no progress for 4.0 s (bound 3.0 s)"]
        gauge = sensor.metrics.registry.get_sample_value(
            "sapwood_ingest_seconds_since_progress", {"topic": "t", "partition": "4"}
        )
        assert gauge == 4.0
        sensor.report_lag({tp: 12}, lambda tps: {tp: 15}, force=True)  # the offset moved
        assert _health(port) == (200, {"status": "ok", "reasons": []})
        sensor.partition_revoked("t", 4)
        assert (
            sensor.metrics.registry.get_sample_value(
                "sapwood_ingest_seconds_since_progress", {"topic": "t", "partition": "4"}
            )
            is None
        )
    finally:
        sensor.close()
