"""The ``sapwood`` agent-loop manager: keeps each prompt's samples on one worker and tells the loops the step.

Add to a verl job's config (beside the agent loop's lines, see :mod:`sapwood.adapters.verl.agent_loop`)::

    +actor_rollout_ref.rollout.agent.agent_loop_manager_class=sapwood.adapters.verl.manager.SapwoodAgentLoopManager

verl's own manager cuts a batch into equal chunks, one per agent-loop worker, so the ``n`` samples of a prompt
(rows sharing a ``uid``, contiguous after verl's interleaved repeat) can land on two workers; the ``sapwood``
loop then records the group as two executions. This manager moves every cut to the nearest group boundary
(:func:`group_aligned_bounds`), so a group is one execution with a fork of degree ``n``, and stamps on every
row what a loop cannot see from its dataset fields:

* ``sapwood_step`` — verl's ``global_steps`` of the batch (the rollout runs on the weights of step − 1);
* ``sapwood_group_size`` — the rows of that ``uid`` in the batch (the fork's degree; 1 in validation);
* ``sapwood_attempt`` — an id drawn once per manager process: a verl job resumed from its checkpoint
  re-runs its last unfinished step under a new attempt, so what the killed attempt half-recorded stays
  apart (unfinished, hence never trained) and nothing is recorded twice under one id;
* ``sapwood_validate`` — whether verl marked the batch as validation;
* ``sapwood_share`` — the worker's chunk index (a group split across workers, only when there are fewer
  groups than workers, is one execution per share, each with its own id).

Everything else is verl's own ``generate_sequences`` (metrics, timing, the ``priority`` column).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

import numpy as np
from verl.experimental.agent_loop.agent_loop import AgentLoopManager

__all__ = ["SapwoodAgentLoopManager", "count_group_sizes", "group_aligned_bounds", "stamp_batch"]


def group_aligned_bounds(uids: Sequence[Any], parts: int) -> list[tuple[int, int]]:
    """``parts`` contiguous ``(start, end)`` row ranges covering ``uids``, near-equal in size, every cut between
    two groups (rows of one uid stay together); a range is empty only when there are fewer groups than parts.

    Rows of one uid must be contiguous (verl repeats a prompt's samples with ``interleave=True``).
    """
    if parts < 1:
        raise ValueError(f"parts is the number of agent-loop workers (≥ 1), got {parts}")
    n = len(uids)
    starts = [i for i in range(n) if i == 0 or uids[i] != uids[i - 1]]
    if len({str(u) for u in uids}) != len(starts):
        raise ValueError("the rows of one uid are not contiguous: expected verl's interleaved repeat "
                         "(all samples of a prompt next to each other)")
    boundaries = [*starts, n]  # every position where a cut keeps groups whole
    cuts = [0]
    for k in range(1, parts):
        target = k * n / parts
        best = min((b for b in boundaries if b >= cuts[-1]), key=lambda b: (abs(b - target), b))
        cuts.append(best)
    cuts.append(n)
    return [(cuts[i], cuts[i + 1]) for i in range(parts)]


def stamp_batch(non_tensor_batch: dict[str, np.ndarray], meta_info: dict[str, Any], attempt: str) -> None:
    """Add the ``sapwood_*`` columns (see the module docstring) to a verl batch's ``non_tensor_batch``."""
    rows = len(next(iter(non_tensor_batch.values()))) if non_tensor_batch else 0
    uids = non_tensor_batch.get("uid")
    if uids is None:
        uids = np.array([uuid.uuid4().hex for _ in range(rows)], dtype=object)
        non_tensor_batch["uid"] = uids
    count_group_sizes(non_tensor_batch)
    non_tensor_batch["sapwood_step"] = np.full(rows, int(meta_info.get("global_steps", -1)), dtype=object)
    non_tensor_batch["sapwood_attempt"] = np.full(rows, attempt, dtype=object)
    non_tensor_batch["sapwood_validate"] = np.full(rows, bool(meta_info.get("validate", False)), dtype=object)
    non_tensor_batch["sapwood_share"] = np.zeros(rows, dtype=object)


def count_group_sizes(non_tensor_batch: dict[str, np.ndarray]) -> None:
    """Set ``sapwood_group_size``: per row, the rows of its ``uid`` in this (part of the) batch."""
    uids = [str(u) for u in non_tensor_batch["uid"]]
    counts: dict[str, int] = {}
    for u in uids:
        counts[u] = counts.get(u, 0) + 1
    non_tensor_batch["sapwood_group_size"] = np.array([counts[u] for u in uids], dtype=object)


class SapwoodAgentLoopManager(AgentLoopManager):
    """verl's manager with group-aligned chunks and the ``sapwood_*`` columns (module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.attempt = uuid.uuid4().hex

    def generate_sequences(self, prompts: Any) -> Any:
        """Stamp the batch, make its ``chunk`` group-aligned, then run verl's own ``generate_sequences``."""
        stamp_batch(prompts.non_tensor_batch, prompts.meta_info, self.attempt)
        workers = len(self.agent_loop_workers)
        bounds = group_aligned_bounds(list(prompts.non_tensor_batch["uid"]), workers)
        original = prompts.chunk

        def chunk(parts: int) -> list[Any]:
            if parts == workers and all(end > start for start, end in bounds):
                pieces = [prompts.slice(start, end) for start, end in bounds]
            else:  # fewer groups than workers: verl's equal chunks, a group's share per worker
                pieces = original(parts)
            for share, piece in enumerate(pieces):  # the fork's degree is what this worker runs of the group
                count_group_sizes(piece.non_tensor_batch)
                piece.non_tensor_batch["sapwood_share"] = np.full(len(piece), share, dtype=object)
            return pieces

        prompts.chunk = chunk
        return super().generate_sequences(prompts)
