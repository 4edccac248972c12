"""Start-up imports of each restarted process kind of a training run, lazy package exports against eager ones.

A process killed during a run (``sapwood chaos training``) is restarted and imports its code before doing
anything. Before the component packages exported their names lazily (``sapwood.platform.lazy_exports``), the
``sapwood`` CLI imported every component's package and with it torch (``sapwood.learner``), FastAPI
(``sapwood.api``) and Kafka/Prometheus (``sapwood.ingest``), whatever the command. This bench imports, in a
fresh interpreter, the modules each kind needs before its first unit of work; ``eager`` adds what the old
package ``__init__`` files imported. Eager and lazy alternate within each repetition, so both see the same
load. Prints one JSON line: per kind and mode the median child CPU seconds (user + sys) and wall seconds, and
the eager/lazy CPU ratio.

    python bench/bench_restart_imports.py [--reps 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

#: The modules each kind imports before its first unit of work.
KINDS: dict[str, list[str]] = {
    "worker": ["sapwood.rollout.prompt_worker"],
    "ingest": ["sapwood.ingest.cli", "sapwood.ingest.service"],
    "learner": ["sapwood.platform.cli", "sapwood.learner.loop", "sapwood.learner.backends", "sapwood.learner.trainer",
                "sapwood.learner.model"],
    "scheduler": ["sapwood.platform.cli", "sapwood.scheduler.live_loop_cli", "sapwood.scheduler.live_loop",
                  "sapwood.scheduler.live_signals", "sapwood.scheduler.policy", "sapwood.scheduler.metrics",
                  "sapwood.rollout.transports", "sapwood.platform.store"],
}
#: What the component packages' ``__init__`` files imported before their exports were lazy.
EAGER = ["sapwood.learner.advantages", "sapwood.learner.batch", "sapwood.learner.config", "sapwood.learner.errors",
         "sapwood.learner.flat", "sapwood.learner.losses", "sapwood.learner.model", "sapwood.learner.trainer",
         "sapwood.api.config", "sapwood.api.main", "sapwood.api.tokenizer", "sapwood.ingest.deadletters",
         "sapwood.ingest.metrics", "sapwood.ingest.service", "sapwood.ingest.topics"]
#: Kinds that start through the ``sapwood`` CLI (the only path the eager package imports reached for all).
CLI_KINDS = {"learner", "scheduler"}
_CHILD = "import importlib, sys\nfor m in sys.argv[1:]:\n    importlib.import_module(m)\n"


def _import_cost(modules: list[str]) -> tuple[float, float]:
    """(child CPU seconds, wall seconds) of a fresh interpreter importing ``modules``."""
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", _CHILD, *modules])
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"importing {modules} failed ({proc.returncode})")
    return usage.ru_utime + usage.ru_stime, wall


def measure(reps: int) -> dict[str, object]:
    samples: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for rep in range(reps):
        for kind, modules in KINDS.items():
            eager = (EAGER + modules) if kind in CLI_KINDS else modules
            modes = [("eager", eager), ("lazy", modules)]
            for mode, mods in modes if rep % 2 == 0 else modes[::-1]:
                samples.setdefault((kind, mode), []).append(_import_cost(mods))
    out: dict[str, object] = {"reps": reps, "loadavg": [round(x, 1) for x in os.getloadavg()]}
    for kind in KINDS:
        row: dict[str, float] = {}
        for mode in ("eager", "lazy"):
            cpu = statistics.median(s[0] for s in samples[(kind, mode)])
            wall = statistics.median(s[1] for s in samples[(kind, mode)])
            row[f"{mode}_cpu_s"], row[f"{mode}_wall_s"] = round(cpu, 3), round(wall, 3)
        row["cpu_ratio"] = round(row["eager_cpu_s"] / row["lazy_cpu_s"], 2)
        out[kind] = row
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=5)
    print(json.dumps(measure(parser.parse_args().reps)))
