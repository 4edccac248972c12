"""Per-token Python-loop reference implementations of the advantage functions.

Slow and literal, for equivalence tests of the vectorized versions in
``sapwood.learner.advantages`` (tests/learner/test_learner_advantages.py). Not used in training.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor

__all__ = [
    "cross_trajectory_gae_loop",
    "full_tree_gae_loop",
    "skip_observation_gae_loop",
    "token_gae_loop",
    "tree_gae_loop",
]


def token_gae_loop(
    rewards: Sequence[float],
    values: Sequence[float],
    gamma: float,
    lam: float,
    dones: Sequence[bool] | None = None,
    bootstrap: float = 0.0,
) -> tuple[list[float], list[float]]:
    """Textbook backward GAE loop; returns ``(advantages, returns)``."""
    n = len(rewards)
    done = [False] * n if dones is None else list(dones)
    adv = [0.0] * n
    nxt_a, nxt_v = 0.0, bootstrap
    for t in reversed(range(n)):
        if done[t]:
            nxt_a, nxt_v = 0.0, 0.0
        delta = rewards[t] + gamma * nxt_v - values[t]
        adv[t] = delta + gamma * lam * nxt_a
        nxt_a, nxt_v = adv[t], values[t]
    return adv, [a + v for a, v in zip(adv, values, strict=True)]


def skip_observation_gae_loop(
    rewards: Sequence[float], values: Sequence[float], trainable: Sequence[bool], gamma: float, lam: float
) -> tuple[list[float], list[float]]:
    """Backward loop over a flat sequence that skips non-trainable tokens."""
    n = len(rewards)
    adv = [0.0] * n
    ret = [0.0] * n
    nxt_a, nxt_v, pending_r = 0.0, 0.0, 0.0
    for t in reversed(range(n)):
        pending_r += rewards[t]
        if not trainable[t]:
            continue
        delta = pending_r + gamma * nxt_v - values[t]
        adv[t] = delta + gamma * lam * nxt_a
        ret[t] = adv[t] + values[t]
        nxt_a, nxt_v, pending_r = adv[t], values[t], 0.0
    return adv, ret


def cross_trajectory_gae_loop(
    values: Sequence[float],
    trainable: Sequence[bool],
    segment: Sequence[int],
    reward: float,
    gamma: float,
    lam: float,
) -> tuple[list[float], list[float]]:
    """Local GAE per segment (terminal reward R at each segment end) times ``(γλ)^{N>s}``."""
    n = len(values)
    adv = [0.0] * n
    ret = [0.0] * n
    num_seg = max(segment) + 1
    counts = [0] * num_seg
    for t in range(n):
        if trainable[t]:
            counts[segment[t]] += 1
    nxt_a, nxt_v, cur = 0.0, 0.0, -1
    for t in reversed(range(n)):
        if not trainable[t]:
            continue
        s = segment[t]
        r = 0.0
        if s != cur:  # last trainable token of segment s: terminal
            nxt_a, nxt_v, r, cur = 0.0, 0.0, reward, s
        delta = r + gamma * nxt_v - values[t]
        a_loc = delta + gamma * lam * nxt_a
        ret[t] = a_loc + values[t]
        n_after = sum(counts[s + 1 :])
        adv[t] = (gamma * lam) ** n_after * a_loc
        nxt_a, nxt_v = a_loc, values[t]
    return adv, ret


class _Tree:
    """Logical tree of a TreeBatch-like structure as Python lists."""

    def __init__(
        self, parent: Tensor, segment_parent: Tensor, trainable: Tensor, leaf_reward: Tensor, values: Tensor
    ) -> None:
        self.n = parent.numel()
        self.sp = segment_parent.tolist()
        self.lp = [s if s >= 0 else p for p, s in zip(parent.tolist(), self.sp, strict=True)]
        self.tr = [bool(x) for x in trainable.tolist()]
        self.reward = leaf_reward.tolist()
        self.v = values.tolist()
        self.children: list[list[int]] = [[] for _ in range(self.n)]
        for i, p in enumerate(self.lp):
            if p >= 0:
                self.children[p].append(i)

    def is_cross(self, i: int) -> bool:
        return self.sp[i] >= 0

    def outcomes(self, t: int, cross_segments: bool) -> list[tuple[float, str, int]]:
        """Branches of trainable ``t``: (probability, kind, node), kind in next/leaf/seg."""
        if not self.children[t]:
            return [(1.0, "leaf", t)]
        out: list[tuple[float, str, int]] = []

        def explore(c: int, prob: float) -> None:
            if self.is_cross(c) and not cross_segments:
                out.append((prob, "seg", c))
            elif self.tr[c]:
                out.append((prob, "next", c))
            elif not self.children[c]:
                out.append((prob, "leaf", c))
            else:
                for cc in self.children[c]:
                    explore(cc, prob / len(self.children[c]))

        for c in self.children[t]:
            explore(c, 1.0 / len(self.children[t]))
        return out


def tree_gae_loop(
    parent: Tensor,
    segment_parent: Tensor,
    trainable: Tensor,
    leaf_reward: Tensor,
    values: Tensor,
    gamma: float,
    lam: float,
    returns_lam: float | None = None,
) -> dict[str, list[float]]:
    """Literal per-token evaluation of ``advantages.tree_gae``'s definition.

    Returns a dict with ``advantages``, ``returns``, ``local_advantages``, ``discount``.
    """
    tree = _Tree(parent, segment_parent, trainable, leaf_reward, values)
    n, ch, tr, v, rew = tree.n, tree.children, tree.tr, tree.v, tree.reward
    gl = gamma * lam
    rl = lam if returns_lam is None else returns_lam
    d = [0.0] * n  # E[(γλ)^{#trainable from x}]
    q = [0.0] * n  # E[(γλ)^{#trainable from x} R]
    rb = [0.0] * n  # E[R]
    m = [0.0] * n  # mean continuation discount of segment ends below x within its segment
    for x in reversed(range(n)):  # children have larger indices
        g = gl if tr[x] else 1.0
        if not ch[x]:
            d[x], q[x], rb[x], m[x] = g, g * rew[x], rew[x], 1.0
            continue
        k = len(ch[x])
        d[x] = g * sum(d[c] for c in ch[x]) / k
        q[x] = g * sum(q[c] for c in ch[x]) / k
        rb[x] = sum(rb[c] for c in ch[x]) / k
        m[x] = sum(d[c] if tree.is_cross(c) else m[c] for c in ch[x]) / k
    adv, a_loc, a_ret = [0.0] * n, [0.0] * n, [0.0] * n
    for t in reversed(range(n)):
        if not tr[t]:
            continue
        a = al = ar = 0.0
        for prob, kind, c in tree.outcomes(t, cross_segments=False):
            if kind == "next":
                a += prob * (m[c] * (gamma * v[c] - v[t]) + gl * adv[c])
                al += prob * (gamma * v[c] - v[t] + gl * a_loc[c])
                ar += prob * (gamma * v[c] - v[t] + gamma * rl * a_ret[c])
            elif kind == "leaf":
                a += prob * (rew[c] - v[t])
                al += prob * (rew[c] - v[t])
                ar += prob * (rew[c] - v[t])
            else:  # segment end: continuation c
                a += prob * (q[c] - d[c] * v[t])
                al += prob * (rb[c] - v[t])
                ar += prob * (rb[c] - v[t])
        adv[t], a_loc[t], a_ret[t] = a, al, ar
    return {
        "advantages": adv,
        "local_advantages": a_loc,
        "returns": [a_ret[i] + v[i] if tr[i] else 0.0 for i in range(n)],
        "discount": [m[i] if tr[i] else 0.0 for i in range(n)],
    }


def full_tree_gae_loop(
    parent: Tensor,
    segment_parent: Tensor,
    trainable: Tensor,
    leaf_reward: Tensor,
    values: Tensor,
    gamma: float,
    lam: float,
) -> list[float]:
    """GAE over the whole logical tree (segments concatenated, no terminal at segment ends),
    Skip-Observation, mean over children at forks. Returns the advantages."""
    tree = _Tree(parent, segment_parent, trainable, leaf_reward, values)
    adv = [0.0] * tree.n
    for t in reversed(range(tree.n)):
        if not tree.tr[t]:
            continue
        a = 0.0
        for prob, kind, c in tree.outcomes(t, cross_segments=True):
            if kind == "next":
                a += prob * (gamma * tree.v[c] - tree.v[t] + gamma * lam * adv[c])
            else:
                a += prob * (tree.reward[c] - tree.v[t])
        adv[t] = a
    return adv
