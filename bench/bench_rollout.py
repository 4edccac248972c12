"""Rollout benchmark: what recording costs a worker, and what a second worker thread adds.

In one run, the same key-recall executions (same seeds, same random-init ``TinyActorCritic``,
local torch engine on CPU) are played three ways:

1. recorded into a ``MemoryTransport`` (the recorder's own work only: tree matching, digests);
2. recorded in-process into a SQLite store (the embedded demo's path);
3. as 2, with two worker threads sharing the recorder (threads, one torch thread each).

It prints executions/s and generated tokens/s of each, the share of a worker's wall time
spent outside the engine (recording + environment), and the 2-thread speed-up. The last
stdout line is a JSON object of the figures.

    python bench/bench_rollout.py --executions 200
"""

from __future__ import annotations

import argparse
import json
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from rich.console import Console

from sapwood.demo.config import DemoConfig
from sapwood.demo.tasks import KeyRecallEnv
from sapwood.demo.worker import ExecutionReport, run_execution
from sapwood.learner.model import TinyActorCritic
from sapwood.platform.store import Store
from sapwood.rollout.recorder import Recorder
from sapwood.rollout.torch_engine import LocalTorchEngine
from sapwood.rollout.transports import InProcessTransport, MemoryTransport, Transport

console = Console(stderr=True)


def _play(transport: Transport, n: int, workers: int, state: dict[str, torch.Tensor], cfg: DemoConfig,
          seed: int) -> dict[str, float]:
    env = KeyRecallEnv(cfg.task)
    recorder = Recorder(transport, run_id=f"bench-{seed}", vocab_size=cfg.task.vocab_size)
    reports: list[ExecutionReport] = []
    lock = threading.Lock()

    def work(index: int) -> None:
        engine = LocalTorchEngine(cfg.model_config(), state=state, seed=index)
        rng = np.random.default_rng([seed, index])
        for _ in range(n // workers):
            r = run_execution(env, engine, recorder, env.sample_task(rng), rng, keep_calls=False)
            with lock:
                reports.append(r)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=work, args=(i,)) for i in range(workers)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    recorder.flush()
    wall = time.perf_counter() - t0
    tokens = sum(r.generated_tokens for r in reports)
    busy = sum(r.finished_at - r.started_at for r in reports)  # execution wall time, summed over workers
    engine = sum(r.engine_seconds for r in reports)
    return {"executions": len(reports), "seconds": round(wall, 3), "executions_per_s": round(len(reports) / wall, 2),
            "generated_tokens_per_s": round(tokens / wall, 1), "calls": sum(r.calls for r in reports),
            "outside_engine_share": round(1 - engine / busy, 3) if busy else 0.0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--executions", type=int, default=120)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.set_num_threads(1)
    cfg = DemoConfig()
    torch.manual_seed(args.seed)
    state = TinyActorCritic(cfg.model_config()).state_dict()

    memory = _play(MemoryTransport(), args.executions, 1, state, cfg, args.seed)
    with tempfile.TemporaryDirectory() as d:
        store = Store.open(f"sqlite:///{Path(d) / 'bench.db'}")
        sqlite1 = _play(InProcessTransport(store), args.executions, 1, state, cfg, args.seed)
        sqlite2 = _play(InProcessTransport(store), args.executions, 2, state, cfg, args.seed + 1)
        store.close()
    figures: dict[str, Any] = {
        "memory_transport": memory,
        "sqlite_1_worker": sqlite1,
        "sqlite_2_workers": sqlite2,
        "store_overhead_ratio": round(sqlite1["seconds"] / memory["seconds"], 3),
        "two_thread_speedup": round(sqlite2["executions_per_s"] / sqlite1["executions_per_s"], 3),
    }
    console.print(f"memory transport: {memory['executions_per_s']} exec/s "
                  f"({memory['outside_engine_share']:.1%} of the time outside the engine); SQLite in-process: "
                  f"{sqlite1['executions_per_s']} exec/s ({sqlite1['outside_engine_share']:.1%} outside; "
                  f"×{figures['store_overhead_ratio']} time); 2 threads: {sqlite2['executions_per_s']} exec/s "
                  f"(speed-up ×{figures['two_thread_speedup']})")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
