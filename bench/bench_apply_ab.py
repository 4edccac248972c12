"""Apply vs raw COPY, old code against new, alternating in one run: is a change to apply a regression?

Each measurement runs in its own process with one checkout's ``platform/src`` first on
``PYTHONPATH`` (this repository's, or the ``--baseline`` one), so both are imported under the same
module names. A process generates the synthetic execution of ``bench_store.py`` (~700K tokens, 300
calls), then ``--repeats`` times: a fresh PostgreSQL database, the same span bytes through a raw
binary COPY, and one cold ``Store.apply`` of the execution — ``bench_store.py``'s
``apply_vs_copy_ratio``. Processes alternate baseline/current (ABBA order across rounds) so drift
on a shared machine falls on both alike. The last stdout line is a JSON object of the figures.

    git archive main platform migrations | tar -x -C "$BASELINE_DIR"   # the code to compare against
    python bench/bench_apply_ab.py --baseline "$BASELINE_DIR" --database-url "$SAPWOOD_TEST_DATABASE_URL"
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console

console = Console(stderr=True)
HERE = Path(__file__).resolve().parent
REPO = HERE.parent


def child(database_url: str, *, repeats: int, seed: int) -> dict[str, Any]:
    """Measurements of the code this process imports (run with ``--child``)."""
    import sapwood.platform
    from pg_bench import drop_database, fresh_database, raw_copy, span_bytes
    from sapwood.platform.store import Store
    from sapwood.platform.synthetic import SynthConfig, synthetic_execution

    events = synthetic_execution(SynthConfig(seed=seed)).events
    spans = span_bytes(events)
    tokens = sum(e.n_tokens() for e in events)
    runs = []
    for _ in range(repeats):
        url, dsn = fresh_database(database_url)
        try:
            store = Store.open(url)
            copy_s = raw_copy(store, spans)
            t0 = time.perf_counter()
            result = store.apply(events)
            apply_s = time.perf_counter() - t0
            assert len(result.applied) == len(events)
            store.close()
        finally:
            drop_database(dsn, url)
        runs.append({"apply_s": apply_s, "copy_s": copy_s, "ratio": copy_s / apply_s, "phases": result.timings})
    return {"platform": str(Path(sapwood.platform.__file__).parent), "tokens": tokens, "runs": runs}


def _run_child(src: Path, args: argparse.Namespace) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(src), str(HERE)])}
    out = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--child", "--database-url", args.database_url,
         "--repeats", str(args.repeats), "--seed", str(args.seed)],
        env=env, check=True, capture_output=True, text=True, timeout=args.child_timeout,
    )
    figures: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    if Path(figures["platform"]).resolve() != (src / "sapwood" / "platform").resolve():
        raise RuntimeError(f"the child imported {figures['platform']}, expected the code under {src}")
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--database-url", default=os.environ.get("SAPWOOD_TEST_DATABASE_URL"),
                        help="PostgreSQL server URL (a fresh database is created on it per measurement)")
    parser.add_argument("--baseline", type=Path, help="root of the checkout to compare against (has platform/src)")
    parser.add_argument("--rounds", type=int, default=2, help="processes per variant (alternating)")
    parser.add_argument("--repeats", type=int, default=2, help="measurements per process")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--child-timeout", type=float, default=300.0)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if not args.database_url or not args.database_url.startswith("postgresql"):
        parser.error("needs --database-url postgresql+psycopg://... (or SAPWOOD_TEST_DATABASE_URL)")
    if args.child:
        print(json.dumps(child(args.database_url, repeats=args.repeats, seed=args.seed)))
        return
    if args.baseline is None or not (args.baseline / "platform" / "src" / "sapwood").is_dir():
        parser.error("--baseline must be the root of a checkout with platform/src/sapwood (see the docstring)")
    variants = {"baseline": args.baseline / "platform" / "src", "current": REPO / "platform" / "src"}
    ratios: dict[str, list[float]] = {name: [] for name in variants}
    phases: dict[str, list[dict[str, float]]] = {name: [] for name in variants}
    tokens = 0
    for r in range(args.rounds):
        order = list(variants) if r % 2 == 0 else list(reversed(variants))
        for name in order:
            figures = _run_child(variants[name], args)
            tokens = figures["tokens"]
            ratios[name] += [run["ratio"] for run in figures["runs"]]
            phases[name] += [run["phases"] for run in figures["runs"]]
            console.print(f"round {r + 1}/{args.rounds} {name:>8}: apply = "
                          + ", ".join(f"{run['ratio']:.3f}x" for run in figures["runs"]) + " raw COPY")
    result: dict[str, Any] = {"tokens": tokens, "rounds": args.rounds, "repeats": args.repeats}
    for name in variants:
        result[f"{name}_apply_vs_copy_ratio"] = round(statistics.median(ratios[name]), 3)
        result[f"{name}_ratios"] = [round(x, 3) for x in ratios[name]]
        result[f"{name}_phases_ms"] = {k: round(statistics.median(p[k] for p in phases[name]) * 1000, 1)
                                       for k in phases[name][0]}
    result["current_over_baseline"] = round(result["current_apply_vs_copy_ratio"]
                                            / result["baseline_apply_vs_copy_ratio"], 3)
    console.print(f"apply vs raw COPY (medians): baseline {result['baseline_apply_vs_copy_ratio']}x, "
                  f"current {result['current_apply_vs_copy_ratio']}x "
                  f"(current / baseline = {result['current_over_baseline']})")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
