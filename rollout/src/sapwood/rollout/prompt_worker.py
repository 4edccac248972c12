"""A synthetic rollout worker over a run's prompt queue, runnable as a process (the crash tests and the
training chaos campaign start it, with ``SAPWOOD_FAULT`` to crash it at a fault point): claims samples until
none is available for ``IDLE_S``, records 1 to 2 × ``CALLS`` model calls per attempt (drawn from the sample id
and attempt number, so a re-issued sample's length is a fresh draw) with tokens derived from the sample id,
finishes each with a 0/1 reward. Each output token is recorded with the log-probability of a uniform policy
over the 500-token vocabulary (about what an untrained learner's policy assigns), so the learner's importance
ratios start near 1 and its policy updates are not masked. Events go straight to the store (one transaction
per event), or, with ``BOOTSTRAP TOPIC``, through Kafka (acknowledged by all replicas) for ingest to apply;
then the worker keeps each sample's lease until ingest has stored its finished execution.

    python -m sapwood.rollout.prompt_worker DATABASE_URL RUN WORKER LEASE_S CALLS IDLE_S [CALL_S [BOOTSTRAP TOPIC]]

``CALL_S``: seconds each model call takes (the engine's generation time, simulated; default 0).
"""

from __future__ import annotations

import hashlib
import sys
import time

import numpy as np

from sapwood.platform.store import Store
from sapwood.rollout import InProcessTransport, KafkaTransport, Recorder
from sapwood.rollout.prompts import PromptClient
from sapwood.rollout.transports import Transport


def tokens(sample_id: str, step: int, n: int) -> np.ndarray:
    seed = int.from_bytes(hashlib.blake2b(f"{sample_id}:{step}".encode(), digest_size=4).digest(), "big")
    return np.random.default_rng(seed).integers(0, 500, n, dtype=np.int32)


def attempt_length(sample_id: str, attempt: int, calls: int) -> int:
    """Model calls of one attempt: 1 … 2 × ``calls`` (mean ≈ ``calls``), fixed by sample id and attempt."""
    return 1 + int(tokens(f"{sample_id}#{attempt}", 98, 1)[0]) % (2 * calls)


VOCAB_SIZE = 500
#: Log-probability (nats) of each recorded output token: a uniform policy's.
BEHAVIOUR_LOGPROB = -float(np.log(VOCAB_SIZE))
#: Seconds a worker waits for ingest to store a finished execution before it gives the sample up.
STORED_TIMEOUT_S = 120.0


def work(url: str, run_id: str, worker: str, *, lease_s: float, calls: int, idle_s: float,
         call_s: float = 0.0, kafka: tuple[str, str] | None = None) -> int:
    """Roll out samples until none arrives for ``idle_s``; returns how many this worker finished.

    ``kafka``: (bootstrap, topic) to record through instead of the store."""
    store = Store.open(url)
    client = PromptClient(store, run_id, worker_id=worker, lease_s=lease_s)
    done = 0
    transport: Transport = (InProcessTransport(store, batch_size=1) if kafka is None
                            else KafkaTransport(kafka[0], topic=kafka[1], linger_ms=2))
    with Recorder(transport, run_id=run_id, vocab_size=VOCAB_SIZE) as rec:
        deadline = time.monotonic() + idle_s
        while True:
            lease = rec.claim_prompt(client)
            if lease is None:
                if time.monotonic() > deadline:
                    return done
                time.sleep(0.05)  # a dead worker's lease may still run
                continue
            with lease.keep_alive():
                ex = lease.start()
                ex.prompt(tokens(lease.sample.sample_id, -1, 8))
                for step in range(attempt_length(lease.sample.sample_id, lease.sample.attempt, calls)):
                    time.sleep(call_s)  # the engine's generation time (simulated)
                    out = tokens(lease.sample.sample_id, step, 4)
                    ex.call(ex.context(), out, np.full(len(out), BEHAVIOUR_LOGPROB, dtype=np.float32))
                ex.finish("success", reward=float(tokens(lease.sample.sample_id, 99, 1)[0] % 2))
                rec.flush()
                if kafka is not None and not lease.wait_stored(STORED_TIMEOUT_S):
                    raise SystemExit(f"sample {lease.sample.sample_id}: ingest stored no finish in "
                                     f"{STORED_TIMEOUT_S} s")
            done += 1
            deadline = time.monotonic() + idle_s


if __name__ == "__main__":
    url, run, worker, lease, calls, idle = sys.argv[1:7]
    call = float(sys.argv[7]) if len(sys.argv) > 7 else 0.0
    via = (sys.argv[8], sys.argv[9]) if len(sys.argv) > 9 else None
    print(work(url, run, worker, lease_s=float(lease), calls=int(calls), idle_s=float(idle), call_s=call,
               kafka=via))
