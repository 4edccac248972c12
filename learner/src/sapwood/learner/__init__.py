"""sapwood.learner — CompactionRL + SAO learner on trajectory trees.

Public surface (re-exported here):

* ``batch``: ``TreeBatch`` (the learner's input), roles, ``flatten``, ``tree_attention_mask``,
  ``TreeBatchBuilder`` (random trees for tests live in tests/support/random_trees.py);
* ``weights``: ``path_probability``, the token weights (1/(d_1⋯d_k) below forks) every loss uses;
  ``flat``: the flattened per-trajectory reference (``flatten``);
* ``horizon``: the horizon-aware default lambda and the credit each segment keeps;
* ``advantages``: ``tree_gae`` (Skip-Observation + cross-trajectory + fork-averaged GAE) and its
  special cases ``token_gae``, ``skip_observation_gae``, ``cross_trajectory_gae``;
* ``losses``: ``dis_policy_loss``, ``ppo_clip_policy_loss``, ``value_loss``, ``aggregate`` (metrics as
  0-d tensors) and ``metric_floats`` (a step's metrics as floats, in one transfer);
* ``model``: ``PolicyBackend`` (the backend interface), ``TorchBackend``, ``TinyActorCritic``;
* ``backends``: ``create_backend(name, ...)`` for ``"torch"`` or ``"megatron"``
  (``megatron_backend.MegatronBackend`` on megatron-core ``GPTModel``; the ``megatron`` extra, imported lazily);
* ``trainer``: ``SAOTrainer`` (warm-up, catch-up, joint DIS + value step);
* ``config``: ``LearnerConfig`` and its parts, ``SourceConfig``, ``DEFAULT_JMAX`` and ``check_jmax``;
  ``errors``: the exception tree;
* ``claims``: ``BatchSource`` (claims of a run's executions under a lease) and ``assembly``: ``build_batch``
  (Jmax-bounded tree batches from the store, in named steps); ``forest``: the pointer-doubling primitives.

Importing ``sapwood.learner`` needs torch installed (the ``learner`` extra); the names are imported on first
use (``sapwood.platform.lazy_exports``), so ``import sapwood.learner.cli`` does not load torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sapwood.platform.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from sapwood.learner.advantages import (
        GAEResult,
        batch_gae,
        cross_trajectory_gae,
        skip_observation_gae,
        token_gae,
        tree_gae,
    )
    from sapwood.learner.batch import (
        ACTION,
        OBSERVATION,
        PROMPT,
        SUMMARY,
        TreeBatch,
        TreeBatchBuilder,
        tree_attention_mask,
    )
    from sapwood.learner.config import (
        AdvantageConfig,
        CriticConfig,
        DISWindow,
        LearnerConfig,
        OptimConfig,
        PolicyLossConfig,
    )
    from sapwood.learner.errors import BatchValidationError, ConfigError, LearnerError
    from sapwood.learner.flat import FlatBatch, flatten
    from sapwood.learner.losses import aggregate, dis_policy_loss, metric_floats, ppo_clip_policy_loss, value_loss
    from sapwood.learner.model import (
        ForwardOutput,
        PolicyBackend,
        TinyActorCritic,
        TinyTransformerConfig,
        TorchBackend,
    )
    from sapwood.learner.trainer import LossTargets, SAOTrainer, compute_losses

__all__ = [
    "ACTION",
    "OBSERVATION",
    "PROMPT",
    "SUMMARY",
    "AdvantageConfig",
    "BatchValidationError",
    "ConfigError",
    "CriticConfig",
    "DISWindow",
    "FlatBatch",
    "ForwardOutput",
    "GAEResult",
    "LearnerConfig",
    "LearnerError",
    "LossTargets",
    "OptimConfig",
    "PolicyBackend",
    "PolicyLossConfig",
    "SAOTrainer",
    "TinyActorCritic",
    "TinyTransformerConfig",
    "TorchBackend",
    "TreeBatch",
    "TreeBatchBuilder",
    "aggregate",
    "batch_gae",
    "compute_losses",
    "cross_trajectory_gae",
    "dis_policy_loss",
    "flatten",
    "metric_floats",
    "ppo_clip_policy_loss",
    "skip_observation_gae",
    "token_gae",
    "tree_attention_mask",
    "tree_gae",
    "value_loss",
]

__getattr__ = lazy_exports(__name__, __all__, ("advantages", "batch", "config", "errors", "flat", "losses", "model",
                                                "trainer"), needs=("torch",))
