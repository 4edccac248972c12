"""Random, valid ``TreeBatch`` trees for the learner's tests (prompts, turns, forks, compaction)."""

from __future__ import annotations

import random
from collections.abc import Sequence

from sapwood.learner.batch import ACTION, OBSERVATION, PROMPT, SUMMARY, TreeBatch, TreeBatchBuilder

__all__ = ["random_tree_batch"]


def random_tree_batch(
    seed: int,
    *,
    num_executions: int = 3,
    max_segments: int = 3,
    max_turns: int = 3,
    fork_prob: float = 0.35,
    max_children: int = 3,
    jmax: int = 4,
    vocab_size: int = 32,
    families: Sequence[str] = ("math", "swe", "synthetic"),
    shared_prompt_prob: float = 0.3,
    untrained_action_prob: float = 0.1,
) -> TreeBatch:
    """A random, valid ``TreeBatch`` for tests.

    Each execution has a prompt, turns of action then observation, forks (several
    tool outcomes after an action, several sampled actions after an observation,
    or a split inside an action), trajectories that end on an action or on a
    trailing observation, and compaction: a summary followed by a new segment,
    either in a fresh context or after a prompt shared with the first context.
    Some actions are not selected for training. At most ``jmax`` trajectories
    per execution.
    """
    rng = random.Random(seed)
    b = TreeBatchBuilder()

    for e in range(num_executions):
        _RandomExecution(
            rng,
            b,
            e,
            seed,
            families,
            vocab_size,
            max_segments,
            max_turns,
            fork_prob,
            max_children,
            jmax,
            shared_prompt_prob,
            untrained_action_prob,
        ).grow()
    return b.build()


class _RandomExecution:
    """Grows one random execution into a ``TreeBatchBuilder`` (helper of ``random_tree_batch``)."""

    def __init__(
        self,
        rng: random.Random,
        b: TreeBatchBuilder,
        e: int,
        seed: int,
        families: Sequence[str],
        vocab_size: int,
        max_segments: int,
        max_turns: int,
        fork_prob: float,
        max_children: int,
        jmax: int,
        shared_prompt_prob: float,
        untrained_action_prob: float,
    ) -> None:
        self.rng, self.b = rng, b
        self.ex = b.add_execution(f"exec-{seed}-{e}", families[rng.randrange(len(families))])
        self.version = rng.randint(0, 3)
        self.vocab_size, self.max_segments, self.max_turns = vocab_size, max_segments, max_turns
        self.fork_prob, self.max_children, self.jmax = fork_prob, max_children, jmax
        self.shared_prompt_prob, self.untrained_action_prob = shared_prompt_prob, untrained_action_prob
        self.leaves = 1  # leaves this execution ends with if nothing else forks
        self.prompt_end = -1

    def run(
        self,
        parent: int,
        role: int,
        lo: int,
        hi: int,
        *,
        trainable: bool | None = None,
        segment_parent: int = -1,
        reward: float | None = None,
    ) -> int:
        n = self.rng.randint(lo, hi)
        tokens = [self.rng.randrange(self.vocab_size) for _ in range(n)]
        logprobs = [-self.rng.random() * 3.0 for _ in range(n)]
        return self.b.add_run(
            self.ex,
            parent,
            tokens,
            role,
            trainable=trainable,
            logprobs=logprobs,
            policy_version=self.version,
            segment_parent=segment_parent,
            reward=reward,
        )

    def n_children(self) -> int:
        room = self.jmax - self.leaves
        if room <= 0 or self.rng.random() >= self.fork_prob:
            return 1
        k = self.rng.randint(2, min(self.max_children, room + 1))
        self.leaves += k - 1
        return k

    def grow(self) -> None:
        self.prompt_end = self.run(-1, PROMPT, 1, 3)
        self.action(self.prompt_end, 0, self.rng.randint(1, self.max_turns))

    def action(self, parent: int, seg: int, turns: int) -> None:
        trainable = self.rng.random() >= self.untrained_action_prob
        if self.rng.random() < 0.3:  # fork inside the action (token-level resampling)
            head = self.run(parent, ACTION, 1, 2, trainable=trainable)
            for _ in range(self.n_children()):
                self.after_action(self.run(head, ACTION, 1, 2, trainable=trainable), seg, turns)
        else:
            self.after_action(self.run(parent, ACTION, 1, 3, trainable=trainable), seg, turns)

    def after_action(self, node: int, seg: int, turns: int) -> None:
        rng = self.rng
        if turns <= 1 or rng.random() < 0.2:
            if seg + 1 < self.max_segments and rng.random() < 0.6:  # compaction
                s_end = self.run(node, SUMMARY, 1, 3)
                if rng.random() < self.shared_prompt_prob:
                    start = self.run(self.prompt_end, PROMPT, 1, 2, segment_parent=s_end)
                else:
                    root = self.run(-1, PROMPT, 1, 2, segment_parent=s_end)
                    start = self.run(root, PROMPT, 1, 2)  # the summary as input of the new context
                self.action(start, seg + 1, self.max_turns)
            elif rng.random() < 0.3:  # trajectory ends on a trailing observation
                self.run(node, OBSERVATION, 1, 2, reward=round(rng.random(), 3))
            else:
                self.b.set_reward(node, round(rng.random(), 3))
            return
        for _ in range(self.n_children()):  # several tool outcomes
            obs = self.run(node, OBSERVATION, 1, 3)
            for _ in range(self.n_children()):  # several sampled next actions
                self.action(obs, seg, turns - 1)
