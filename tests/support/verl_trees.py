"""Executions recorded the way the verl adapter records them: a prompt, a fork of n samples, calls per branch."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sapwood.platform.store import Store
from sapwood.rollout.recorder import Recorder
from sapwood.rollout.transports import InProcessTransport


@dataclass
class RecordedSample:
    """What one branch of a recorded execution holds: the trajectory's tokens in order, and its reward."""

    prompt: list[int]
    outputs: list[list[int]]
    logprobs: list[list[float]]
    observations: list[list[int]]
    reward: float


def record_group(store: Store, run_id: str, task_id: str, *, samples: int, turns: int, seed: int,
                 vocab: int = 50) -> tuple[str, list[RecordedSample]]:
    """One execution: a prompt, a fork into ``samples`` branches, ``turns`` calls per branch with an
    observation between calls; branch i's reward is i / samples. Returns the execution id and the branches."""
    rng = np.random.default_rng(seed)
    prompt = rng.integers(1, vocab, 5).astype(np.int32)
    out: list[RecordedSample] = []
    with Recorder(InProcessTransport(store, batch_size=1), run_id=run_id, engine="test", vocab_size=vocab) as rec:
        ex = rec.start(task_id, task_family="verl-test")
        root = ex.prompt(prompt).node_id
        if samples > 1:
            ex.fork(samples, at=root)
        leaves: dict[str, float] = {}
        for s in range(samples):
            context = list(prompt.tolist())
            head = root
            sample = RecordedSample(list(prompt.tolist()), [], [], [], s / samples)
            for t in range(turns):
                if t > 0:
                    obs = rng.integers(1, vocab, 2).astype(np.int32)
                    context += obs.tolist()
                    sample.observations.append(obs.tolist())
                ids = rng.integers(1, vocab, 3).astype(np.int32)
                lps = -rng.random(3).astype(np.float32)
                call = ex.call(np.array(context, dtype=np.int32), ids, lps, after=head, policy_version=1)
                head = call.output_node_id
                context += ids.tolist()
                sample.outputs.append(ids.tolist())
                sample.logprobs.append(lps.tolist())
            leaves[head] = sample.reward
            out.append(sample)
        ex.finish("success", float(np.mean(list(leaves.values()))), leaf_rewards=leaves)
        eid = ex.execution_id
    return eid, out

#: Vocabulary of the verl suite's tiny tokenizer and model.
TOKENIZER_VOCAB = 64
