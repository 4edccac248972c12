"""Node roles: what a node's tokens are. Stored as small integers (``nodes.role``) and used as the
learner's per-token role codes."""

from __future__ import annotations

from enum import IntEnum


class Role(IntEnum):
    """Role of a node (and of each of its tokens)."""

    PROMPT = 0
    """Input that is not a model output: system/task prompt, the summary copied into a new segment."""
    OBSERVATION = 1
    """Environment or tool output (never trainable)."""
    ACTION = 2
    """Model-generated action tokens."""
    SUMMARY = 3
    """Model-generated compaction summary (trainable, same reward as the actions)."""

    @property
    def label(self) -> str:
        """Lower-case name, as the API and exports show it (``"action"``)."""
        return self.name.lower()


ROLE_NAMES: dict[int, str] = {r.value: r.label for r in Role}
"""Role code → label, for readers holding plain integers."""

TRAINABLE_ROLES: frozenset[Role] = frozenset({Role.ACTION, Role.SUMMARY})
"""Roles whose tokens are model outputs and so can be trained on (``trainable_roles()``)."""


def trainable_roles(*, train_summaries: bool = True) -> frozenset[Role]:
    """The trainable-role rule: model outputs (actions, summaries) are trainable; prompts and observations
    never are. ``train_summaries=False`` freezes the summarizer (summaries stay in context, untrained)."""
    return TRAINABLE_ROLES if train_summaries else TRAINABLE_ROLES - {Role.SUMMARY}
