"""A learner batch as verl-shaped rows: one row per (trajectory, context), prompt then response.

verl trains on rows of ``prompt ids`` (what the model was given) and ``response ids`` (what followed:
model output, mask 1, and tool observations between calls, mask 0). A Sapwood trajectory is a
logical root-to-leaf path of an execution's tree; within one context (segment) it is one causal sequence
(:func:`sapwood.learner.flat.flatten`), so it becomes one row: the prompt is everything before the
sequence's first trainable token, the response everything from there on. A trajectory that crosses a
compaction boundary has one sequence per segment and so one row per segment, each carrying the
trajectory's reward (the CompactionRL rule: every segment shares the final outcome). At most Jmax
trajectories per execution, as the learner selects them (:class:`~sapwood.learner.config.SourceConfig`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from sapwood.learner.batch import TreeBatch
from sapwood.learner.flat import flatten

__all__ = ["TrajectoryRow", "trajectory_rows"]


@dataclass(frozen=True)
class TrajectoryRow:
    """One verl sample, unpadded."""

    prompt_ids: list[int]
    """Tokens before the first trainable token of the sequence."""
    response_ids: list[int]
    """Tokens from the first trainable token to the end of the sequence."""
    response_mask: list[int]
    """Per response token: 1 for model output that is trained, 0 for observations (and frozen summaries)."""
    rollout_log_probs: list[float]
    """Per response token: the engine's log-prob where ``response_mask`` is 1, else 0."""
    reward: float
    """The trajectory's final reward (0.0 when the execution is unscored)."""
    execution_id: str
    task_family: str
    leaf_index: int
    """Token index (in the source batch) of the trajectory's logical leaf: rows of one trajectory share it."""


def trajectory_rows(batch: TreeBatch) -> tuple[list[TrajectoryRow], int]:
    """The rows of ``batch``; also how many sequences had no trainable token (left out)."""
    flat = flatten(batch)
    rows: list[TrajectoryRow] = []
    untrainable = 0
    for index, leaf in zip(flat.token_index, flat.trajectory, strict=True):
        trainable = batch.trainable[index]
        if not bool(trainable.any()):
            untrainable += 1
            continue
        first = int(torch.nonzero(trainable)[0])
        tokens = batch.tokens[index].tolist()
        mask = trainable[first:].to(torch.int64)
        logprob = torch.where(trainable[first:], batch.rollout_logprob[index[first:]].to(torch.float32),
                              torch.zeros(len(mask), dtype=torch.float32))
        reward = float(batch.leaf_reward[leaf])
        exe = int(batch.execution[leaf])
        rows.append(TrajectoryRow(
            prompt_ids=tokens[:first], response_ids=tokens[first:], response_mask=mask.tolist(),
            rollout_log_probs=logprob.tolist(), reward=0.0 if math.isnan(reward) else reward,
            execution_id=batch.execution_ids[exe], task_family=batch.task_family[exe], leaf_index=int(leaf),
        ))
    return rows, untrainable
