"""What the gateway's session journal costs per recorded call, side by side with no journal, in one run.

One chained session of ``--calls`` calls (each ``--new`` new prompt tokens and ``--out`` output tokens, as a
gateway records them through the rollout SDK) is recorded into the gateway's background recorder in front of
a transport that drops events, once without and once with the journal (:class:`JournaledTransport` appending
each event to a file on local disk), alternately for ``--rounds`` rounds (ABAB...). Per call: CPU time of the
process (all threads: encoding, the write, the recorder thread) and wall time; journal bytes per call.
``--fsync`` also forces every append to the disk. The last stdout line is one JSON object.

    python bench/bench_journal.py [--calls 300] [--rounds 4] [--new 60] [--out 32] [--fsync]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from sapwood.gateway.journal import JournaledTransport, SessionJournal
from sapwood.gateway.recording import BackgroundRecorder
from sapwood.platform.events import Event
from sapwood.rollout.recorder import Recorder
from sapwood.rollout.transports import Transport


class Drop(Transport):
    """Delivers every event at once and keeps nothing."""

    def send(self, event: Event) -> None:
        self._delivered(event, None)


def one_round(calls: int, new: int, out: int, journal: Path | None, fsync: bool) -> dict[str, float]:
    """Record one chained session; returns CPU and wall milliseconds per call and journal bytes per call."""
    recorder = BackgroundRecorder(Drop())
    transport: Transport = recorder
    if journal is not None:
        transport = JournaledTransport(recorder, SessionJournal(journal, fsync=fsync))
    rng = np.random.default_rng(0)
    ex = Recorder(transport, run_id="bench-journal").start("t", metadata={"session_id": "s"})
    context = rng.integers(0, 150_000, new).tolist()
    cpu0, wall0 = time.process_time(), time.perf_counter()
    for _ in range(calls):
        output = rng.integers(0, 150_000, out).tolist()
        call = ex.call(context, output, [-0.5] * out)
        context = [*context, *output, *rng.integers(0, 150_000, new).tolist()]
        del call
    recorder.flush(60.0)
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    recorder.close(60.0)
    transport.close()
    size = journal.stat().st_size if journal is not None else 0
    return {"cpu_ms": 1e3 * cpu / calls, "wall_ms": 1e3 * wall / calls, "bytes": size / calls}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--new", type=int, default=60, help="new prompt tokens per call")
    parser.add_argument("--out", type=int, default=32, help="output tokens per call")
    parser.add_argument("--fsync", action="store_true", help="force each journal append to the disk")
    args = parser.parse_args(argv)
    rows: dict[str, list[dict[str, float]]] = {"none": [], "journal": []}
    with tempfile.TemporaryDirectory() as tmp:
        for k in range(args.rounds):
            for name in ("none", "journal"):
                path = Path(tmp) / f"r{k}.journal" if name == "journal" else None
                rows[name].append(one_round(args.calls, args.new, args.out, path, args.fsync))
    print(f"{'round':>5} {'cpu ms/call none':>17} {'journal':>8} {'wall ms/call none':>18} {'journal':>8} "
          f"{'journal B/call':>15}")
    for k in range(args.rounds):
        a, b = rows["none"][k], rows["journal"][k]
        print(f"{k:>5} {a['cpu_ms']:>17.3f} {b['cpu_ms']:>8.3f} {a['wall_ms']:>18.3f} {b['wall_ms']:>8.3f} "
              f"{b['bytes']:>15.0f}")
    result = {
        "calls": args.calls, "rounds": args.rounds, "fsync": args.fsync,
        "cpu_ms_per_call": {n: statistics.median(r["cpu_ms"] for r in rows[n]) for n in rows},
        "wall_ms_per_call": {n: statistics.median(r["wall_ms"] for r in rows[n]) for n in rows},
        "journal_bytes_per_call": statistics.median(r["bytes"] for r in rows["journal"]),
    }
    result["cpu_added_ms_per_call"] = result["cpu_ms_per_call"]["journal"] - result["cpu_ms_per_call"]["none"]
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
