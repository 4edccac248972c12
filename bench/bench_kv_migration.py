"""Moving a live execution's KV to another cell: migrate through Ray's object store vs recompute on the target.

    python bench/bench_kv_migration.py [--tokens 16,64,256,1024] [--reps 5]

Two cell actors (the local torch engine, one torch thread each) on a local Ray. For each context length the
source cell holds the session's KV; "migrate" is ``export_kv`` on the source + ``import_kv`` on the target
(``ray.put``/``ray.get`` of the tensors, every RPC included), "recompute" is ``prefill`` on the target. It
prints bytes, median seconds of each, their ratio, the per-token/per-byte fit, and what
``CheaperHandoff``'s rule (with the fitted coefficients) picks.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import ray
import torch

from sapwood.learner.model import TinyActorCritic, TinyTransformerConfig
from sapwood.scheduler.runtime.cluster import CellActor, init_ray
from sapwood.scheduler.runtime.switch import CheaperHandoff


def timed(fn: Any) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--tokens", default="16,64,256,1024")
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    lengths = [int(x) for x in args.tokens.split(",")]
    cfg = TinyTransformerConfig(vocab_size=256, d_model=64, n_heads=4, n_layers=2, d_ff=256,
                                max_position=max(lengths) + 1)
    torch.manual_seed(0)
    state = TinyActorCritic(cfg).state_dict()
    init_ray(num_cpus=2)
    src: Any
    dst: Any
    src, dst = (CellActor.options(max_concurrency=4).remote(c, cfg, state, role="rollout") for c in ("src", "dst"))
    rows = []
    for n in lengths:
        ids = [int(t) for t in torch.randint(0, cfg.vocab_size, (n,))]
        mig, rec, nbytes = [], [], 0
        for r in range(args.reps + 1):  # the first rep warms both paths up and is not counted
            ray.get(src.prefill.remote("s", ids))
            nbytes = int(ray.get(src.kv_info.remote("s"))["bytes"])
            m = timed(lambda: ray.get(dst.import_kv.remote("s", ray.get(src.export_kv.remote("s")))))
            c = timed(lambda ids=ids: ray.get(dst.prefill.remote("s2", ids)))
            if r:
                mig.append(m)
                rec.append(c)
        rows.append((n, nbytes, statistics.median(mig), statistics.median(rec)))
    ray.shutdown()
    # least-squares fits: migrate_s = overhead + bytes / bandwidth; recompute_s = tokens * per_token
    xs, ms = [r[1] for r in rows], [r[2] for r in rows]
    mx, mm = statistics.fmean(xs), statistics.fmean(ms)
    slope = sum((x - mx) * (m - mm) for x, m in zip(xs, ms, strict=True)) / sum((x - mx) ** 2 for x in xs)
    overhead = max(mm - slope * mx, 0.0)
    per_token = sum(r[3] * r[0] for r in rows) / sum(r[0] ** 2 for r in rows)
    rule = CheaperHandoff(migrate_overhead_s=overhead, migrate_bytes_per_s=1 / max(slope, 1e-12),
                          recompute_s_per_token=per_token)
    print(f"model d_model {cfg.d_model}, {cfg.n_layers} layers; median of {args.reps}; every RPC counted")
    print(f"{'tokens':>7}{'KV bytes':>11}{'migrate ms':>12}{'recompute ms':>14}{'recompute/migrate':>19}"
          f"{'rule picks':>12}{'faster':>11}")
    for n, b, m, c in rows:
        print(f"{n:>7}{b:>11}{m * 1e3:>12.2f}{c * 1e3:>14.2f}{c / m:>19.2f}{rule.choose(n, b):>12}"
              f"{'migrate' if m < c else 'recompute':>11}")
    print(f"fit: migrate_overhead_s={overhead:.4g} migrate_bytes_per_s={1 / max(slope, 1e-12):.4g} "
          f"recompute_s_per_token={per_token:.4g}")


if __name__ == "__main__":
    main()
