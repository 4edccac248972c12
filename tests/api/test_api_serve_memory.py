"""``sapwood serve`` keeps no torch or learner code in its workers: the idle worker's RSS, measured."""

from __future__ import annotations

import os
import re
from pathlib import Path

import httpx
import pytest

from tests.support.live_server import sapwood_serve

#: Bound on an idle worker's resident memory. With torch loaded (what the ``sapwood`` command's other
#: sub-commands import) a worker holds 600-800 MB; the API alone measures ~120-160 MB (docs/api-hardening.md).
IDLE_RSS_BOUND_MB = 250


def _rss_mb(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    match = re.search(r"^VmRSS:\s+(\d+) kB", status, re.MULTILINE)
    assert match, status
    return int(match.group(1)) / 1024


def _mapped_libraries(pid: int) -> set[str]:
    return {Path(line.split()[-1]).name for line in Path(f"/proc/{pid}/maps").read_text().splitlines()
            if line.split()[-1].endswith(".so") or ".so." in line.split()[-1]}


def _children(pid: int) -> list[int]:
    return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc (Linux)")
@pytest.mark.parametrize("workers", [1, 2])
def test_idle_serve_worker_has_no_torch_and_small_rss(tmp_path: Path, workers: int) -> None:
    env = {"SAPWOOD_DATABASE_URL": f"sqlite:///{tmp_path / 'serve.db'}"}
    pids: list[int] = []
    with sapwood_serve(env, "--log-level", "warning", "--workers", str(workers), pids=pids) as base:
        assert httpx.get(base + "/healthz", timeout=10).status_code == 200
        (pid,) = pids
        # one worker: the server process answers itself; more: its spawned children (the worker processes)
        # (uvicorn's workers are multiprocessing spawns; its resource tracker is another child, not a worker)
        serving = [pid] if workers == 1 else [c for c in _children(pid)
                                              if "spawn_main" in Path(f"/proc/{c}/cmdline").read_text()]
        measured = {p: (_rss_mb(p), _mapped_libraries(p)) for p in serving}
    assert len(measured) == workers, measured.keys()
    for p, (rss, libraries) in measured.items():
        print(f"idle sapwood serve worker ({workers} workers): {rss:.0f} MB RSS (pid {p}, {os.cpu_count()} CPUs)")
        torch_libs = sorted(name for name in libraries if "torch" in name)
        assert torch_libs == [], f"worker {p} mapped torch's libraries: {torch_libs}"
        assert rss < IDLE_RSS_BOUND_MB, f"idle worker {p}: RSS {rss:.0f} MB >= {IDLE_RSS_BOUND_MB} MB"
