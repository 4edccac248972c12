"""The trajectory tree: the one home of its rules, used by apply, the recorder, the learner and the API.

- :mod:`.roles` — what a node's tokens are (:class:`Role`) and which roles are trainable (:func:`trainable_roles`);
- :mod:`.nodes` — the node record every reader gets, and the logical-parent rule that links a
  compaction's new segment root to the summary it continues;
- :mod:`.prefix` — longest-prefix matching of a full token input against the stored nodes;
- :mod:`.rewards` — which reward a trajectory is trained on (and what the API shows).
"""

from sapwood.platform.tree.nodes import NodeRecord, logical_parent, logical_parent_sql
from sapwood.platform.tree.prefix import match_prefix
from sapwood.platform.tree.rewards import (
    DEFAULT_REWARD_POLICY,
    ResolvedReward,
    RewardPolicy,
    RewardSource,
    resolve_reward,
)
from sapwood.platform.tree.roles import ROLE_NAMES, TRAINABLE_ROLES, Role, trainable_roles

__all__ = [
    "DEFAULT_REWARD_POLICY",
    "ROLE_NAMES",
    "TRAINABLE_ROLES",
    "NodeRecord",
    "ResolvedReward",
    "RewardPolicy",
    "RewardSource",
    "Role",
    "logical_parent",
    "logical_parent_sql",
    "match_prefix",
    "resolve_reward",
    "trainable_roles",
]
