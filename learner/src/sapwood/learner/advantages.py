"""Advantages: token-level, Skip-Observation and cross-trajectory GAE on token trees.

All functions are pure, run under ``torch.no_grad()``, compute in float64 and
return float32. None of them loops over tokens in Python: chains and trees are
solved by pointer doubling (``O(log length)`` whole-tensor rounds, see
``forest.tree_accumulate``).

Conventions. ``values[i]`` is V of the state just before token ``i`` (read from
the model at ``parent[i]``). Only trainable tokens take part in the recursion:
observation and prompt tokens are skipped, so their values never enter any
TD error (Skip-Observation GAE).

Tree GAE (``tree_gae``), for a trainable token t with *branches* b (each child
branch, followed through non-trainable tokens and their forks to the first
trainable token n_b, or to a terminal: a trajectory leaf or a segment end)::

    Â(t) = mean_b [ m_b * (r_b + γ V_b - V(t)) + γλ Â_b ]

* local branch to n_b:      r_b = 0,  V_b = V(n_b),  Â_b = Â(n_b),  m_b = m(n_b)
* trajectory leaf:          r_b = R_leaf,  V_b = 0,  Â_b = 0,  m_b = 1
* segment end (compaction): V_b = 0, Â_b = 0,  m_b = E[(γλ)^N],  m_b * r_b = E[(γλ)^N R]

N is the number of trainable tokens that follow the segment end along a
continuation path, E the mean over continuation branches (uniform at each
fork, recursively), and m(x) the same mean of the continuation discounts of
every segment end below x. Fork means weigh branches equally, so an
execution's shared prefix gets one trajectory's credit however often it forks.

Special cases: on a chain with one segment this is Skip-Observation GAE, and
with every token trainable it is token-level GAE. On a chain of segments,
m is constant inside a segment, ``m_s = (γλ)^{N>s}``, and
``Â = (γλ)^{N>s} · A^loc`` exactly (CompactionRL's cross-trajectory GAE,
``A^loc`` being local GAE with the final reward at every segment end). With
V ≡ 0 it equals GAE over the whole logical tree (segments concatenated) — on
trees too, because a segment end contributes the mean of ``(γλ)^N R`` rather
than a product of separate means.

Critic targets are local λ-returns ``A^loc + V``: GAE inside each segment with
the *mean* final reward of the continuations at a segment end (no discount
multiplier — the critic predicts the local return).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from sapwood.learner.batch import TreeBatch
from sapwood.learner.config import AdvantageConfig
from sapwood.learner.forest import child_count, child_sum, tree_accumulate

__all__ = [
    "GAEResult",
    "batch_gae",
    "cross_trajectory_gae",
    "skip_observation_gae",
    "token_gae",
    "tree_gae",
]

_F = torch.float64


@dataclass(frozen=True)
class GAEResult:
    """Output of ``tree_gae``; every tensor is [T] float32 and 0 where not trainable."""

    advantages: Tensor
    """Â: cross-trajectory, fork-averaged advantages for the policy loss."""
    returns: Tensor
    """Critic targets: local λ-returns ``A^loc(returns_lam) + V``."""
    local_advantages: Tensor
    """A^loc(lam): GAE inside each segment, segment ends terminal with the mean continuation reward."""
    discount: Tensor
    """m: mean continuation discount ``E[(γλ)^{N after the segment end}]`` (1 in the last segment)."""


def _chain_parent(n: int, device: torch.device) -> Tensor:
    """[n] int64 parents of the chain 0 <- 1 <- ... <- n-1 seen backwards: ``parent[i] = i - 1``."""
    return torch.arange(-1, n - 1, device=device)


@torch.no_grad()
def token_gae(
    rewards: Tensor,
    values: Tensor,
    *,
    gamma: float,
    lam: float,
    dones: Tensor | None = None,
    bootstrap: float = 0.0,
) -> tuple[Tensor, Tensor]:
    """Classic GAE over one sequence of steps (e.g. the tokens of one action).

    ``δ_t = r_t + γ V_{t+1} (1 - done_t) - V_t``, ``A_t = δ_t + γλ (1 - done_t) A_{t+1}``.

    Args:
        rewards: [L] reward received after step t.
        values: [L] V_t.
        gamma: discount.
        lam: GAE lambda.
        dones: [L] bool, step t is terminal (no bootstrap, no continuation);
            default only the last step, which bootstraps from ``bootstrap``.
        bootstrap: value after the last step when it is not done.

    Returns:
        ``(advantages [L], returns [L])`` float32, ``returns = advantages + values``.
    """
    n = rewards.numel()
    r, v = rewards.to(_F), values.to(_F)
    done = torch.zeros(n, dtype=torch.bool, device=r.device) if dones is None else dones.to(torch.bool)
    v_next = torch.cat([v[1:], torch.tensor([bootstrap], dtype=_F, device=v.device)])
    cont = (~done).to(_F)
    delta = r + gamma * v_next * cont - v
    # A_t = δ_t + γλ cont_t A_{t+1}: a tree where step t+1's parent is t.
    weight = torch.cat([torch.zeros(1, dtype=_F, device=r.device), gamma * lam * cont[:-1]])
    adv = tree_accumulate(_chain_parent(n, r.device), weight, delta)
    return adv.float(), (adv + v).float()


@torch.no_grad()
def skip_observation_gae(
    rewards: Tensor,
    values: Tensor,
    trainable: Tensor,
    *,
    gamma: float,
    lam: float,
) -> tuple[Tensor, Tensor]:
    """Skip-Observation GAE over one flat sequence of interleaved actions and observations.

    The recursion runs over trainable tokens only: the next state of the last
    token of action i is the first token of action i+1,
    ``δ = r + γ V(a_{i+1,0}) - V(a_{i,N})``, so observation values never enter.
    A reward on a non-trainable token counts for the last trainable token
    before it (rewards before the first trainable token are dropped).

    Args:
        rewards: [L] float.
        values: [L] float, V of the state before each token; ignored where not trainable.
        trainable: [L] bool.
        gamma: discount per trainable token.
        lam: GAE lambda.

    Returns:
        ``(advantages [L], returns [L])`` float32, 0 where not trainable.
    """
    tr = trainable.to(torch.bool)
    k = torch.cumsum(tr.to(torch.int64), 0) - 1  # index among trainable tokens of the last one so far
    n = int(tr.sum())
    adv = torch.zeros(rewards.numel(), dtype=torch.float32, device=rewards.device)
    ret = torch.zeros_like(adv)
    if n == 0:
        return adv, ret
    r = torch.zeros(n, dtype=_F, device=rewards.device)
    r.index_add_(0, k[k >= 0], rewards.to(_F)[k >= 0])
    a, g = token_gae(r, values[tr], gamma=gamma, lam=lam)
    adv[tr], ret[tr] = a, g
    return adv, ret


@torch.no_grad()
def cross_trajectory_gae(
    values: Tensor,
    trainable: Tensor,
    segment: Tensor,
    reward: float,
    *,
    gamma: float,
    lam: float,
) -> tuple[Tensor, Tensor]:
    """Cross-trajectory GAE over one logical trajectory (segments concatenated in order).

    Local Skip-Observation GAE inside each segment, each segment end terminal
    with the final reward, then ``Â_{s,i} = (γλ)^{N>s} A^loc_{s,i}`` with
    ``N>s`` the trainable tokens of the later segments.

    Args:
        values: [L] float, V of the state before each token.
        trainable: [L] bool.
        segment: [L] int64 segment index, non-decreasing, 0..S-1.
        reward: final reward R of the trajectory.
        gamma: discount.
        lam: GAE lambda.

    Returns:
        ``(advantages [L], returns [L])`` float32, 0 where not trainable; ``returns``
        are the local λ-returns ``A^loc + V``.
    """
    tr = trainable.to(torch.bool)
    adv = torch.zeros(values.numel(), dtype=torch.float32, device=values.device)
    ret = torch.zeros_like(adv)
    seg = segment[tr]
    n = seg.numel()
    if n == 0:
        return adv, ret
    is_end = torch.ones(n, dtype=torch.bool, device=seg.device)
    is_end[:-1] = seg[1:] != seg[:-1]
    rewards = torch.where(is_end, float(reward), 0.0).to(_F)
    a_loc, g = token_gae(rewards, values[tr], gamma=gamma, lam=lam, dones=is_end)
    num_seg = int(segment.max()) + 1
    n_s = torch.bincount(seg, minlength=num_seg).to(_F)
    after = torch.flip(torch.cumsum(torch.flip(n_s, [0]), 0), [0]) - n_s  # N_{>s}
    mult = torch.pow(torch.tensor(gamma * lam, dtype=_F), after)
    adv[tr] = (mult[seg] * a_loc.to(_F)).float()
    ret[tr] = g
    return adv, ret


@torch.no_grad()
def tree_gae(
    parent: Tensor,
    segment_parent: Tensor,
    trainable: Tensor,
    leaf_reward: Tensor,
    values: Tensor,
    *,
    gamma: float,
    lam: float,
    returns_lam: float | None = None,
) -> GAEResult:
    """Skip-Observation, cross-trajectory, fork-averaged GAE on a token tree (see module doc).

    Args:
        parent: [T] int64 context parents (-1 at context roots).
        segment_parent: [T] int64 segment links (-1 where unset); see ``TreeBatch``.
        trainable: [T] bool.
        leaf_reward: [T] float final reward at logical leaves (any value elsewhere).
        values: [T] float, V of the state before each token; only trainable entries are read.
        gamma: discount per trainable token.
        lam: GAE lambda of the advantages.
        returns_lam: GAE lambda of the critic targets (default ``lam``).

    Returns:
        ``GAEResult`` of [T] float32 tensors.
    """
    dev = parent.device
    tr = trainable.to(torch.bool)
    v = torch.where(tr, values.to(_F), 0.0)

    lp = torch.where(segment_parent >= 0, segment_parent, parent)  # logical parent
    has = lp >= 0
    cross = segment_parent >= 0  # the edge lp -> x crosses a segment boundary
    local = has & ~cross
    lp_local = torch.where(local, lp, -1)
    p = lp.clamp(min=0)
    deg = child_count(lp).to(_F)
    leaf = deg == 0
    inv_deg = torch.where(leaf, 0.0, 1.0 / deg.clamp(min=1.0))
    up = inv_deg[p]  # 1/deg(parent) for each child
    reward = torch.where(leaf, leaf_reward.to(_F), 0.0)
    gl = gamma * lam
    g = torch.where(tr, gl, 1.0)

    # Whole logical tree from x (x included): D = E[(γλ)^{#trainable}], Q = E[(γλ)^{#trainable} R], Rbar = E[R].
    w_full = torch.where(has, g[p] * up, 0.0)
    big_d = tree_accumulate(lp, w_full, torch.where(leaf, g, 0.0))
    big_q = tree_accumulate(lp, w_full, torch.where(leaf, g * reward, 0.0))
    r_bar = tree_accumulate(lp, torch.where(has, up, 0.0), reward)

    # Terminal terms of each node: its leaf reward, or the means over its continuation segments.
    def cross_mean(x: Tensor) -> Tensor:
        return child_sum(torch.where(cross, lp, -1), x * up)

    term_m = cross_mean(big_d) + leaf.to(_F)
    term_q = cross_mean(big_q) + reward
    term_r = cross_mean(r_bar) + reward

    # m(x): mean continuation discount of the segment ends below x inside its segment.
    w_local = torch.where(local, up, 0.0)
    m = tree_accumulate(lp_local, w_local, term_m)

    # Entry aggregates into a branch: stop at the first trainable token.
    w_stop = torch.where(local & ~tr[p], up, 0.0)

    def first_trainable(const: Tensor) -> Tensor:
        """Per trainable t: mean over t's branches of ``const`` at the branch's first trainable token
        or terminal (non-trainable tokens pass through, forks average)."""
        entry = tree_accumulate(lp_local, w_stop, const)
        return child_sum(lp_local, entry * w_local)

    def scan(delta: Tensor, lam_: float) -> Tensor:
        w = torch.where(local, torch.where(tr[p], gamma * lam_, 1.0) * up, 0.0)
        return torch.where(tr, tree_accumulate(lp_local, w, torch.where(tr, delta, 0.0)), 0.0)

    zero = torch.zeros((), dtype=_F, device=dev)
    # Policy: Â(t) = Σ_b mean [ m_b r_b + γ m_b V_b ] - m(t) V(t) + γλ mean_b Â_b.
    bq = term_q + first_trainable(torch.where(tr, zero, term_q))
    bmv = first_trainable(torch.where(tr, m * v, zero))
    adv = scan(bq + gamma * bmv - m * v, lam)

    # Critic: local GAE with the mean continuation reward at segment ends, no multiplier.
    br = term_r + first_trainable(torch.where(tr, zero, term_r))
    bv = first_trainable(torch.where(tr, v, zero))
    delta_loc = br + gamma * bv - v
    a_loc = scan(delta_loc, lam)
    rl = lam if returns_lam is None else returns_lam
    a_ret = a_loc if rl == lam else scan(delta_loc, rl)
    returns = torch.where(tr, a_ret + v, 0.0)
    return GAEResult(
        advantages=adv.float(),
        returns=returns.float(),
        local_advantages=a_loc.float(),
        discount=torch.where(tr, m, 0.0).float(),
    )


@torch.no_grad()
def batch_gae(batch: TreeBatch, values: Tensor, config: AdvantageConfig) -> GAEResult:
    """``tree_gae`` on a ``TreeBatch``.

    Args:
        batch: the tree.
        values: [T] V of the state before each token (the model's value head at ``parent[i]``).
        config: gamma, lam (``effective_lam``: the override or ``1 - 1/horizon_tokens``), returns_lam.
    """
    return tree_gae(
        batch.parent,
        batch.segment_parent,
        batch.trainable,
        batch.leaf_reward,
        values,
        gamma=config.gamma,
        lam=config.effective_lam,
        returns_lam=config.returns_lam,
    )
