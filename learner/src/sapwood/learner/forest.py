"""Vectorized primitives over parent-pointer forests (pointer doubling).

A forest of ``T`` nodes is given by ``parent`` ([T] int64, ``-1`` at a root).
Every function here runs ``O(log depth)`` rounds of whole-tensor operations:
there is no Python loop per node. In round ``k`` each node knows its ancestor
``2**k`` steps up (``anc``) and the product of edge weights on that stretch of
path, so ``ceil(log2(depth + 1))`` rounds cover every root-to-node path.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

__all__ = [
    "ancestor_mask",
    "ancestor_product",
    "ancestor_sum",
    "child_count",
    "child_sum",
    "depth",
    "root_of",
    "tree_accumulate",
]


def child_count(parent: Tensor) -> Tensor:
    """Number of children of every node.

    Args:
        parent: [T] int64, ``-1`` at roots.

    Returns:
        [T] int64.
    """
    count = torch.zeros(parent.numel(), dtype=torch.int64, device=parent.device)
    has = parent >= 0
    count.index_add_(0, parent[has], torch.ones_like(parent[has]))
    return count


def child_sum(parent: Tensor, value: Tensor) -> Tensor:
    """Sum of ``value`` over the children of every node.

    Args:
        parent: [T] int64, ``-1`` at roots (and on cut edges).
        value: [T] float, the value each node sends to its parent.

    Returns:
        [T] float, same dtype as ``value``.
    """
    out = torch.zeros_like(value)
    has = parent >= 0
    out.index_add_(0, parent[has], value[has])
    return out


def tree_accumulate(parent: Tensor, weight: Tensor, const: Tensor) -> Tensor:
    """Solve ``Y(x) = const(x) + sum over children y of x of weight(y) * Y(y)`` for every node.

    Equivalently ``Y(x) = sum over descendants d of x (x included) of W(x, d) * const(d)``,
    where ``W(x, d)`` is the product of ``weight`` over the edges of the path from ``x``
    down to ``d`` (``W(x, x) = 1``). Every backward recursion of GAE on a tree is
    of this form. Solved by pointer doubling: after round ``k``, ``Y`` holds the
    sum over descendants less than ``2**k`` edges below.

    Args:
        parent: [T] int64, ``-1`` at roots; set it to ``-1`` to cut an edge.
        weight: [T] float, weight of the edge from a node up to its parent
            (ignored at roots).
        const: [T] float, the node's own term.

    Returns:
        [T] float, dtype of ``const``.
    """
    dtype = const.dtype
    zero = torch.zeros((), dtype=dtype, device=const.device)
    y = const.clone()
    anc = parent
    valid = anc >= 0
    w = torch.where(valid, weight.to(dtype), zero)
    while bool(valid.any()):
        a = anc.clamp(min=0)
        # Contributions from descendants 2**k..2**(k+1)-1 below, via the node 2**k below.
        y = y.index_add(0, a, torch.where(valid, w * y, zero))
        # Jump: ancestor 2**(k+1) up and the weight of that longer stretch.
        anc = torch.where(valid, anc.index_select(0, a), -1)
        valid = anc >= 0
        w = torch.where(valid, w * w.index_select(0, a), zero)
    return y


def _ancestor_scan(parent: Tensor, const: Tensor, combine: Callable[[Tensor, Tensor], Tensor]) -> Tensor:
    """``combine`` of ``const`` over every node and all its ancestors (a top-down prefix scan).

    Pointer doubling: after round ``k``, ``Z(x)`` combines ``x`` and its ancestors less than
    ``2**k`` edges up. ``combine`` must be associative (``+``, ``*``).
    """
    z = const.clone()
    anc = parent
    valid = anc >= 0
    while bool(valid.any()):
        a = anc.clamp(min=0)
        z = torch.where(valid, combine(z, z.index_select(0, a)), z)
        anc = torch.where(valid, anc.index_select(0, a), -1)
        valid = anc >= 0
    return z


def ancestor_sum(parent: Tensor, const: Tensor) -> Tensor:
    """Sum of ``const`` over every node and all its ancestors (a top-down prefix sum).

    Args:
        parent: [T] int64, ``-1`` at roots.
        const: [T] numeric.

    Returns:
        [T], dtype of ``const``.
    """
    return _ancestor_scan(parent, const, torch.add)


def ancestor_product(parent: Tensor, const: Tensor) -> Tensor:
    """Product of ``const`` [T] over every node and all its ancestors (``ancestor_sum`` with ``*``)."""
    return _ancestor_scan(parent, const, torch.mul)


def depth(parent: Tensor) -> Tensor:
    """Number of edges from every node up to its root.

    Args:
        parent: [T] int64, ``-1`` at roots.

    Returns:
        [T] int64.
    """
    return ancestor_sum(parent, torch.ones_like(parent)) - 1


def root_of(parent: Tensor) -> Tensor:
    """Index of the root of every node's tree.

    Args:
        parent: [T] int64, ``-1`` at roots.

    Returns:
        [T] int64 (a root maps to itself).
    """
    r = torch.where(parent >= 0, parent, torch.arange(parent.numel(), device=parent.device))
    while True:
        nr = r.index_select(0, r)
        if bool((nr == r).all()):
            return r
        r = nr


def ancestor_mask(parent: Tensor) -> Tensor:
    """Tree attention mask: ``mask[i, j]`` is True iff ``j == i`` or ``j`` is an ancestor of ``i``.

    Built by doubling over rows: ``M_{k+1}[i] = M_k[i] | M_k[anc_k(i)]``.

    Args:
        parent: [T] int64, ``-1`` at roots.

    Returns:
        [T, T] bool.
    """
    n = parent.numel()
    mask = torch.eye(n, dtype=torch.bool, device=parent.device)
    anc = parent
    valid = anc >= 0
    while bool(valid.any()):
        a = anc.clamp(min=0)
        mask = mask | (mask.index_select(0, a) & valid.unsqueeze(1))
        anc = torch.where(valid, anc.index_select(0, a), -1)
        valid = anc >= 0
    return mask
