"""Path-probability token weights: an execution's loss weight does not grow with its forks.

A batch keeps at most Jmax trajectories per execution and stores their shared tokens
once. Counted once with weight 1, a shared prefix is fine, but every branch below a
fork then adds its own tokens at full weight: an execution that forks 10 ways (8 kept)
pulls several times the gradient of one that does not, and the policy learns that
forking pays. The fix weighs each token by the probability of reaching it when one
trajectory of its execution is drawn uniformly at every fork, among the kept children::

    w(x) = 1 / (d_1 · d_2 ⋯ d_k)

where ``d_1..d_k`` are the numbers of logical children (kept branches) of the forks above
``x``. Shared-prefix tokens weigh 1; the weights of a node's children sum to the node's
weight. So the sum of ``w`` over an execution's trainable tokens is the expected
trainable length of one of its trajectories, whatever its forks and whatever Jmax kept.
An execution whose kept trajectories do not share a logical root (several roots) splits
weight 1 evenly over its roots, as if a fork sat above them.

The forks are those of the *logical* tree (``segment_parent`` where set, else
``parent``), the tree the advantages average over: a prompt prefix that a later segment's
context shares is one logical path, not a fork.
"""

from __future__ import annotations

import torch
from torch import Tensor

from sapwood.learner.forest import ancestor_product, child_count

__all__ = ["path_probability", "per_execution_sum"]


def path_probability(logical_parent: Tensor, execution: Tensor, num_executions: int) -> Tensor:
    """Probability of every token under a uniform choice at each fork of its execution.

    Pointer doubling over the logical tree (``O(log depth)`` whole-tensor rounds).

    Args:
        logical_parent: [T] int64 logical parents, ``-1`` at logical roots; ``parent[i] < i``.
        execution: [T] int64 execution index of each token.
        num_executions: E.

    Returns:
        [T] float64 in (0, 1]: 1 on an unforked execution, ``1 / (d_1⋯d_k)`` below forks.
    """
    lp = logical_parent
    deg = child_count(lp).to(torch.float64)
    root = lp < 0
    roots = torch.zeros(num_executions, dtype=torch.float64, device=lp.device)
    roots.index_add_(0, execution[root], torch.ones(int(root.sum()), dtype=torch.float64, device=lp.device))
    # The factor each token adds to its path: 1 / (kept children of its parent); a root's share of its execution.
    factor = torch.where(root, 1.0 / roots.clamp(min=1.0)[execution], 1.0 / deg[lp.clamp(min=0)].clamp(min=1.0))
    return ancestor_product(lp, factor)


def per_execution_sum(values: Tensor, execution: Tensor, num_executions: int) -> Tensor:
    """Sum of ``values`` [T] over each execution's tokens; returns [E], dtype of ``values``."""
    out = torch.zeros(num_executions, dtype=values.dtype, device=values.device)
    return out.index_add_(0, execution, values)
