"""TITO event model: every fact Sapwood records is one of these immutable events.

* ``base``: the envelope (``Event``: event id, execution id, per-execution ``seq``, schema
  version, creation time), static validation, and ``derive_node_id`` (the ids of the tree
  nodes an event creates, known to the producer without asking the store);
* ``execution``: the trajectory tree's events and ``policy_published``;
* ``cells``: the elastic scheduler's cell events;
* ``registry``: ``EVENT_TYPES`` (kind → class) and ``build_event``.

Every public name of the four is re-exported here (``sapwood.platform.events.ModelCall``).
"""

from sapwood.platform.events import base, cells, execution, registry
from sapwood.platform.events.base import *  # noqa: F403
from sapwood.platform.events.cells import *  # noqa: F403
from sapwood.platform.events.execution import *  # noqa: F403
from sapwood.platform.events.registry import *  # noqa: F403

__all__ = [*base.__all__, *cells.__all__, *execution.__all__, *registry.__all__]
