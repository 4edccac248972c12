"""Split a ``TreeBatch`` into per-rank sub-batches of whole executions (data parallelism).

Tree GAE, the DIS windows and the loss terms of a token depend only on its own execution, so a
sub-batch of whole executions gives every one of its tokens the targets it has in the whole batch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch
from torch import Tensor

from sapwood.learner.batch import TreeBatch
from sapwood.learner.errors import BatchValidationError

__all__ = ["select_executions", "shard_by_execution"]

_INDEX_FIELDS = ("parent", "segment_parent")  # token indices (-1: none), renumbered
_NON_TOKEN_FIELDS = ("task_family", "execution_ids", "_cache")


def select_executions(batch: TreeBatch, executions: Sequence[int]) -> TreeBatch:
    """The sub-batch of ``batch`` holding the tokens of ``executions`` (indices into ``execution_ids``).

    Token order is kept, token indices (``parent``, ``segment_parent``) and execution indices are
    renumbered; every other per-token tensor field is indexed as it is.
    """
    wanted = sorted(set(int(e) for e in executions))
    if any(not 0 <= e < batch.num_executions for e in wanted):
        raise BatchValidationError(f"execution indices {wanted} outside 0..{batch.num_executions - 1}")
    ex = torch.tensor(wanted, dtype=torch.int64, device=batch.device)
    keep = torch.isin(batch.execution, ex)
    index = keep.nonzero().squeeze(1)
    new_token = torch.full((batch.num_tokens + 1,), -1, dtype=torch.int64, device=batch.device)
    new_token[index] = torch.arange(index.numel(), device=batch.device)  # slot T stays -1 (for parent -1)
    new_execution = torch.full((batch.num_executions,), -1, dtype=torch.int64, device=batch.device)
    new_execution[ex] = torch.arange(len(wanted), device=batch.device)
    kw: dict[str, object] = {}
    for f in dataclasses.fields(batch):
        if f.name in _NON_TOKEN_FIELDS:
            continue
        value = getattr(batch, f.name)
        if not isinstance(value, Tensor):
            kw[f.name] = value
        elif f.name in _INDEX_FIELDS:
            kw[f.name] = new_token[torch.where(value[index] >= 0, value[index], batch.num_tokens)]
        elif f.name == "execution":
            kw[f.name] = new_execution[value[index]]
        else:
            kw[f.name] = value[index]
    return TreeBatch(**kw, task_family=[batch.task_family[e] for e in wanted],  # type: ignore[arg-type]
                     execution_ids=[batch.execution_ids[e] for e in wanted])


def shard_by_execution(batch: TreeBatch, rank: int, world: int) -> TreeBatch:
    """Rank ``rank`` of ``world``'s share: executions ``rank, rank + world, ...``."""
    if not 0 <= rank < world:
        raise BatchValidationError(f"rank {rank} outside 0..{world - 1}")
    if batch.num_executions < world:
        raise BatchValidationError(f"{batch.num_executions} executions cannot give each of {world} ranks one")
    return select_executions(batch, range(rank, batch.num_executions, world))
