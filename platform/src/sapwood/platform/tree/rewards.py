"""Reward resolution: the one rule the learner trains on and the API shows.

An execution records a final reward (``executions.reward``), partial-score revisions (the latest is
``executions.score``) and optional per-leaf rewards (``executions.leaf_rewards``). Which of them a
trajectory is trained on — or whether it is left out — is decided here, once, by
:func:`resolve_reward` under a :class:`RewardPolicy`. The learner's batch source and the API's
execution, tree, trajectory and export answers call it with the same :data:`DEFAULT_REWARD_POLICY`,
so the API shows exactly the reward the learner trains on.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

RewardSource = Literal[
    "leaf",
    "final",
    "partial_score",
    "missing",
    "zero: timeout",
    "zero: error",
    "excluded: error",
    "excluded: running",
]
"""Where a resolved reward came from; ``excluded: ...`` means the learner does not train on it."""


@dataclass(frozen=True)
class RewardPolicy:
    """How an execution's reward is chosen from what the store recorded."""

    timeout: Literal["partial_score", "zero"] = "partial_score"
    """Timed-out executions: the latest partial score (default) or 0."""
    timeout_scale: float = 1.0
    """Multiplier on a timed-out execution's partial score (e.g. < 1 to prefer finishing)."""
    error: Literal["skip", "zero"] = "skip"
    """Executions that ended in error: left out of training (default) or reward 0."""
    missing: float = 0.0
    """Reward of a successful execution that recorded none."""

    def reward(self, status: str, reward: float | None, score: float | None) -> float | None:
        """The execution's reward, or None to leave it out of training (see :func:`resolve_reward`)."""
        return resolve_reward(status, reward, score, policy=self).reward


DEFAULT_REWARD_POLICY = RewardPolicy()
"""The policy the learner trains with unless configured otherwise, and the one the API shows."""


@dataclass(frozen=True)
class ResolvedReward:
    """The reward a trajectory is trained on (None: left out of training) and where it came from."""

    reward: float | None
    source: RewardSource


def resolve_reward(
    status: str,
    final_reward: float | None,
    latest_score: float | None,
    leaf_rewards: Mapping[str, float] | None = None,
    leaf_id: str | None = None,
    *,
    policy: RewardPolicy = DEFAULT_REWARD_POLICY,
) -> ResolvedReward:
    """Resolve the training reward of execution-level ``status`` / ``final_reward`` / ``latest_score``.

    With ``leaf_id`` the result is that trajectory's reward: a recorded per-leaf reward wins over the
    execution's, unless the execution is excluded (an error under ``error="skip"``, or still running —
    the learner only claims finished executions). Order for the execution's own reward:

    - ``error``: excluded (``skip``) or 0 (``zero``);
    - ``timeout``: the final reward if one was recorded, else the latest partial score times
      ``timeout_scale`` (``partial_score``; 0 without a score) or 0 (``zero``);
    - ``success``: the final reward, else the latest partial score, else ``policy.missing``.
    """
    if status == "running":
        return ResolvedReward(None, "excluded: running")
    if status == "error" and policy.error == "skip":
        return ResolvedReward(None, "excluded: error")
    if leaf_id is not None and leaf_rewards and leaf_id in leaf_rewards:
        return ResolvedReward(float(leaf_rewards[leaf_id]), "leaf")
    if status == "error":
        return ResolvedReward(0.0, "zero: error")
    if final_reward is not None:
        return ResolvedReward(float(final_reward), "final")
    if status == "timeout":
        if policy.timeout == "zero" or latest_score is None:
            return ResolvedReward(0.0, "zero: timeout")
        return ResolvedReward(float(latest_score) * policy.timeout_scale, "partial_score")
    if latest_score is not None:
        return ResolvedReward(float(latest_score), "partial_score")
    return ResolvedReward(float(policy.missing), "missing")
