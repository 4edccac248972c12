"""The flattened per-trajectory baseline of a ``TreeBatch``: ordinary causal sequences.

``flatten`` unrolls every trajectory (logical root-to-leaf path) of a batch into the
causal sequences the model saw along it — one per context it passes through, each
from the context's root to the trajectory's last token in that context — as a
trainer without tree packing would. Its weights are computed *per trajectory*, by a
walk up each trajectory, independently of the tree-packed ``TreeBatch.path_weight``:
a trajectory drawn uniformly at each fork has probability ``P = 1 / (d_1⋯d_k)`` (over
its forks' kept degrees), and each of its tokens gets ``P`` split over the token's
occurrences in that trajectory's sequences (a prompt prefix shared by two of its
segments' contexts occurs twice). Summed over trajectories, a token's occurrences
weigh its path probability, so a weighted loss over occurrences equals the
tree-packed loss.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from sapwood.learner.errors import BatchValidationError
from sapwood.learner.forest import ancestor_mask, child_count

if TYPE_CHECKING:
    from sapwood.learner.batch import TreeBatch

__all__ = ["FlatBatch", "flatten"]


@dataclass(frozen=True)
class FlatBatch:
    """A ``TreeBatch`` unrolled into causal sequences, one per (trajectory, context) pair."""

    token_index: list[Tensor]
    """Per sequence: [L_s] int64 indices into the ``TreeBatch``, root first."""
    weight: list[Tensor]
    """Per sequence: [L_s] float64, the trajectory's probability / the token's occurrences in it."""
    trajectory: list[int]
    """Per sequence: token index of the logical leaf that ends its trajectory."""

    @property
    def num_sequences(self) -> int:
        """Number of flattened sequences."""
        return len(self.token_index)

    def cat_index(self) -> Tensor:
        """[N] int64, all occurrences' token indices, sequences concatenated."""
        return torch.cat(self.token_index)

    def cat_weight(self) -> Tensor:
        """[N] float64, all occurrences' weights, sequences concatenated."""
        return torch.cat(self.weight)


def _trajectory_probability(leaf: int, logical_parent: list[int], children: list[int], root_share: float) -> float:
    """``root_share / (d_1⋯d_k)``: walk from ``leaf`` up to its logical root."""
    prob = root_share
    x = logical_parent[leaf]
    while x >= 0:
        prob /= children[x]
        x = logical_parent[x]
    return prob


def flatten(batch: TreeBatch) -> FlatBatch:
    """Unroll ``batch`` into the causal sequences of each trajectory (the flattened baseline).

    Loops over trajectories and their contexts, not over tokens (the probability walk aside).

    Raises:
        BatchValidationError: a context holds a token that is not on the trajectory
            (a context shared across segments must be the trajectory's own prefix).
    """
    n = batch.num_tokens
    parent = batch.parent
    lp = batch.logical_parent()
    ctx_mask = batch.attention_mask()  # context ancestors: what each token's sequence holds
    on_path_of = ancestor_mask(lp)  # logical ancestors: the trajectory up to each token
    lp_list, children = lp.tolist(), child_count(lp).tolist()
    root = lp < 0
    roots = torch.zeros(batch.num_executions, dtype=torch.int64).index_add_(
        0, batch.execution[root], torch.ones(int(root.sum()), dtype=torch.int64)
    )
    execution = batch.execution.tolist()
    has_parent = parent >= 0
    token_index: list[Tensor] = []
    weights: list[Tensor] = []
    trajectory: list[int] = []
    for leaf in batch.is_leaf().nonzero().squeeze(1).tolist():
        prob = _trajectory_probability(leaf, lp_list, children, 1.0 / int(roots[execution[leaf]]))
        on_path = on_path_of[leaf]
        # A sequence ends at each token of the trajectory with no context child on the trajectory.
        ctx_children = torch.zeros(n, dtype=torch.int64)
        sel = on_path & has_parent
        ctx_children.index_add_(0, parent[sel], torch.ones(int(sel.sum()), dtype=torch.int64))
        ends = (on_path & (ctx_children == 0)).nonzero().squeeze(1).tolist()
        seqs = [ctx_mask[end].nonzero().squeeze(1) for end in ends]  # ascending index == root first
        occurrences = torch.zeros(n, dtype=torch.float64)
        for seq in seqs:
            if not bool(on_path[seq].all()):
                raise BatchValidationError(
                    f"token {int(seq[-1])}: its context holds tokens outside trajectory {leaf}'s path"
                )
            occurrences.index_add_(0, seq, torch.ones(seq.numel(), dtype=torch.float64))
        for seq in seqs:
            token_index.append(seq)
            weights.append(prob / occurrences[seq])
            trajectory.append(leaf)
    return FlatBatch(token_index=token_index, weight=weights, trajectory=trajectory)
