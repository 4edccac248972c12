"""Coverage-guided fuzzing of ingest's record decoder and event validator (atheris, the ``fuzz`` extra).

    python bench/fuzz_ingest.py --minutes 2

Each input is one Kafka record value; the oracle (``tests/support/ingest_fuzz.py``) asserts that it
becomes one event or one dead letter with a known reason, that no exception escapes or reaches the
decoder's catch-all, and that peak memory and time per record stay under the stated bounds. The corpus
starts from valid records (plain and zstd) of a small execution. Prints executions, executions/s and the
outcome counts; a broken contract stops the run with the input that broke it.
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import atheris  # noqa: E402  (the `fuzz` extra: pip install -e '.[fuzz]')

with atheris.instrument_imports(include=["sapwood"]):  # coverage of Sapwood's code only
    from sapwood.platform.codec import encode
    from tests.support.histories import small_execution
    from tests.support.ingest_fuzz import MAX_PEAK_BYTES, MAX_SECONDS, check_record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=2.0)
    parser.add_argument("--trace-memory-every", type=int, default=10,
                        help="trace memory on every Nth input (tracemalloc slows each traced input ~5x)")
    args = parser.parse_args()
    corpus = ROOT / ".fuzz-corpus"
    corpus.mkdir(exist_ok=True)
    for i, e in enumerate(small_execution(7).events):
        for compress in (False, True):
            (corpus / f"seed-{i}-{int(compress)}").write_bytes(encode(e, compress=compress))
    counts: collections.Counter[str] = collections.Counter()
    start = time.perf_counter()
    deadline = start + args.minutes * 60
    peak = 0

    def one(data: bytes) -> None:
        nonlocal peak
        n = sum(counts.values())
        outcome = check_record(data, trace_memory=n % args.trace_memory_every == 0)
        counts[outcome.result] += 1
        peak = max(peak, outcome.peak_bytes)
        if time.perf_counter() > deadline:
            report(counts, start, peak)
            os._exit(0)  # libFuzzer treats a Python exit as a crash

    atheris.Setup([sys.argv[0], str(corpus), "-max_len=70000", "-rss_limit_mb=2048"], one)
    atheris.Fuzz()


def report(counts: collections.Counter[str], start: float, peak: int) -> None:
    total = sum(counts.values())
    seconds = time.perf_counter() - start
    print(f"\nexecutions {total:,} in {seconds:.0f} s: {total / seconds:,.0f}/s")
    print(f"bounds: peak traced {peak:,} bytes (bound {MAX_PEAK_BYTES:,}), time per record ≤ {MAX_SECONDS} s")
    print("outcomes: " + ", ".join(f"{k} {v:,}" for k, v in counts.most_common()), flush=True)


if __name__ == "__main__":
    main()
