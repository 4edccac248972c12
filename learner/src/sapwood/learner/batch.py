"""``TreeBatch``: the learner's input, a batch of executions as one token tree.

A batch holds the **unique** tokens of a set of executions (T tokens). Two kinds
of edges connect them:

* **Context edges** ``parent[i]``: the previous token in the same model context.
  They define what each token attends to (its ancestors) and its position. Forks
  share their prefix, so a shared token is stored, computed and trained once.
  A token with ``parent == -1`` is a *context root*.
* **Segment edges** ``segment_parent[i]`` (CompactionRL): on the first token of
  segment k>0, the index of the last summary token of segment k-1 that the new
  segment continues. Usually that first token is a context root (a fresh context
  built from the task prompt and the summary); it may also be the first token
  after a task-prompt prefix shared with an earlier context of the execution.

The *logical tree* follows ``segment_parent`` where it is set and ``parent``
elsewhere: its root-to-leaf paths are the logical trajectories (all segments
concatenated), its leaves carry the rewards. Tokens are topologically ordered:
``parent[i] < i`` and ``segment_parent[i] < i``.

Value and log-prob conventions (used by GAE, the losses and the models): the
log-prob and the value *of token i* are read from the model output at
``parent[i]``, i.e. they belong to the state just before token ``i`` was produced.
A context root therefore has neither and can never be trainable.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from sapwood.learner.config import check_jmax
from sapwood.learner.errors import BatchValidationError
from sapwood.learner.forest import ancestor_mask, child_count, root_of
from sapwood.learner.weights import path_probability, per_execution_sum
from sapwood.platform.tree import ROLE_NAMES, Role, trainable_roles

__all__ = [
    "ACTION",
    "OBSERVATION",
    "PROMPT",
    "ROLE_NAMES",
    "SUMMARY",
    "TreeBatch",
    "TreeBatchBuilder",
    "tree_attention_mask",
]

# The per-token role codes are the tree's roles (one definition, in sapwood.platform.tree.roles).
PROMPT, OBSERVATION, ACTION, SUMMARY = Role.PROMPT, Role.OBSERVATION, Role.ACTION, Role.SUMMARY


def tree_attention_mask(parent: Tensor) -> Tensor:
    """Tree attention mask: ``mask[i, j]`` is True iff ``j`` is ``i`` or a context ancestor of ``i``.

    Vectorized by pointer doubling over ``parent`` (``O(log depth)`` rounds).

    Args:
        parent: [T] int64 context parents, ``-1`` at context roots.

    Returns:
        [T, T] bool, ready for ``torch.nn.functional.scaled_dot_product_attention``
        (True = may attend).
    """
    return ancestor_mask(parent)


@dataclass(eq=False)
class TreeBatch:
    """A batch of executions packed as one forest of unique tokens.

    Per-token tensors are 1-D of length ``T`` (the number of unique tokens);
    per-execution lists have length ``E``. Derived structure (logical parents,
    leaves, segments, the attention mask) is cached on first use, so do not
    change ``parent``, ``segment_parent`` or ``tokens`` in place afterwards.
    """

    tokens: Tensor
    """[T] int64 token ids."""
    parent: Tensor
    """[T] int64 index of the previous token in the same context; -1 at a context root. ``parent[i] < i``."""
    position: Tensor
    """[T] int64 position within the context: 0 at a context root, ``position[parent] + 1`` otherwise."""
    role: Tensor
    """[T] int64 role: ``PROMPT`` 0, ``OBSERVATION`` 1, ``ACTION`` 2, ``SUMMARY`` 3."""
    trainable: Tensor
    """[T] bool, action or summary tokens selected for training (the set M of the loss)."""
    rollout_logprob: Tensor
    """[T] float32 log pi_rollout(token | context) logged by the engine that sampled it; 0 where not trainable."""
    policy_version: Tensor
    """[T] int64 weights version that generated the token; -1 for prompt and observation tokens."""
    execution: Tensor
    """[T] int64 index into ``execution_ids`` / ``task_family``."""
    segment_parent: Tensor
    """[T] int64: on the first token of segment k>0, the index of the last summary token of
    segment k-1 it continues; -1 elsewhere. ``segment_parent[i] < i``."""
    leaf_reward: Tensor
    """[T] float32 final reward (partial scores included) at each logical leaf, NaN elsewhere."""
    task_family: list[str]
    """[E] task family of each execution (``"math"``, ``"swe"``, ...); selects the DIS window."""
    execution_ids: list[str]
    """[E] execution ids as stored by the platform."""
    weight: Tensor | None = None
    """[T] float32/float64 loss weight of each token, or None (the default) for the path probability
    (``path_weight``): 1 on shared prefixes, ``1 / (d_1⋯d_k)`` below forks of kept degrees ``d``.
    Every loss reads it through ``token_weight``; set it only to override the rule."""
    _cache: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    # ------------------------------------------------------------------ sizes
    @property
    def num_tokens(self) -> int:
        """T, the number of unique tokens."""
        return int(self.tokens.numel())

    @property
    def num_executions(self) -> int:
        """E, the number of executions."""
        return len(self.execution_ids)

    @property
    def device(self) -> torch.device:
        """Device of the per-token tensors."""
        return self.tokens.device

    def to(self, device: torch.device | str) -> TreeBatch:
        """A copy with every tensor on ``device``."""
        kw = {name: getattr(self, name).to(device) for name in _TENSOR_FIELDS}
        weight = None if self.weight is None else self.weight.to(device)
        return TreeBatch(
            **kw, task_family=list(self.task_family), execution_ids=list(self.execution_ids), weight=weight
        )

    def context_view(self, tokens: Tensor) -> tuple[TreeBatch, Tensor]:
        """``(view, index)``: the tokens of ``tokens`` ([T] bool) and every context ancestor they attend to,
        as a batch of their own ([t] re-indexed ``parent`` / ``segment_parent``; a ``segment_parent``
        outside the view becomes -1), and ``index`` [t] int64 of each view token in this batch.

        Under the tree attention a token's outputs depend on its context ancestors alone, so the view's
        forward gives the selected tokens' outputs of the whole batch's forward (to float rounding) at a
        fraction of its cost. The view keeps ``execution_ids`` / ``task_family`` and this batch's weights
        (``token_weight()``, computed on the whole batch: a view may drop a fork's other branches). It is for
        a forward, not a batch to train on alone: its cut trajectories end without their leaf rewards.
        """
        if tokens.shape != self.tokens.shape or tokens.dtype != torch.bool:
            raise ValueError(f"context_view takes a [T] bool mask, T = {self.num_tokens}; got "
                             f"{tuple(tokens.shape)} {tokens.dtype}")
        keep = self.attention_mask()[tokens].any(dim=0) | tokens
        index = keep.nonzero().squeeze(1)
        remap = torch.full((self.num_tokens,), -1, dtype=torch.int64, device=self.device)
        remap[index] = torch.arange(index.numel(), device=self.device)

        def local(ref: Tensor) -> Tensor:
            return torch.where(ref >= 0, remap[ref.clamp(min=0)], torch.full_like(ref, -1))

        kw = {name: getattr(self, name)[index] for name in _TENSOR_FIELDS}
        kw["parent"], kw["segment_parent"] = local(kw["parent"]), local(kw["segment_parent"])
        view = TreeBatch(**kw, task_family=list(self.task_family), execution_ids=list(self.execution_ids),
                         weight=self.token_weight()[index])
        return view, index

    # -------------------------------------------------------- derived (cached)
    def _cached(self, key: str, make: Any) -> Tensor:
        if key not in self._cache:
            self._cache[key] = make()
        value: Tensor = self._cache[key]
        return value

    def logical_parent(self) -> Tensor:
        """[T] int64 parent in the logical tree: ``segment_parent`` where set, else ``parent`` — the
        logical-parent rule of :func:`sapwood.platform.tree.logical_parent`, on token indices."""
        return self._cached(
            "logical_parent",
            lambda: torch.where(self.segment_parent >= 0, self.segment_parent, self.parent),
        )

    def is_leaf(self) -> Tensor:
        """[T] bool, logical leaves (the last token of each trajectory)."""
        return self._cached("is_leaf", lambda: child_count(self.logical_parent()) == 0)

    def segment_start(self) -> Tensor:
        """[T] int64 index of the first token of each token's segment (context root or segment start)."""

        def make() -> Tensor:
            starts = (self.parent < 0) | (self.segment_parent >= 0)
            return root_of(torch.where(starts, torch.full_like(self.parent, -1), self.logical_parent()))

        return self._cached("segment_start", make)

    def attention_mask(self) -> Tensor:
        """[T, T] bool tree attention mask (see ``tree_attention_mask``), cached."""
        return self._cached("attention_mask", lambda: tree_attention_mask(self.parent))

    def path_weight(self) -> Tensor:
        """[T] float64 path probability of each token (``sapwood.learner.weights``), cached."""
        return self._cached(
            "path_weight", lambda: path_probability(self.logical_parent(), self.execution, self.num_executions)
        )

    def token_weight(self) -> Tensor:
        """[T] loss weight of each token: ``weight`` if set, else ``path_weight()``."""
        return self.path_weight() if self.weight is None else self.weight

    def execution_weight(self) -> Tensor:
        """[E] float64 total loss weight of each execution's trainable tokens (its share of |M|)."""
        w = torch.where(self.trainable, self.token_weight().to(torch.float64), 0.0)
        return per_execution_sum(w, self.execution, self.num_executions)

    def trajectories_per_execution(self) -> Tensor:
        """[E] int64 number of logical leaves (selected trajectories) of each execution."""
        out = torch.zeros(self.num_executions, dtype=torch.int64, device=self.device)
        leaf = self.is_leaf()
        out.index_add_(0, self.execution[leaf], torch.ones_like(self.execution[leaf]))
        return out

    # -------------------------------------------------------------- validate
    def validate(self, *, jmax: int | None = None) -> None:
        """Check every structural invariant; raise ``BatchValidationError`` saying what is wrong.

        Args:
            jmax: if given, at most this many trajectories (logical leaves) per execution.
        """
        if jmax is not None:
            check_jmax(jmax)
        t = self.num_tokens
        expected = {
            "tokens": torch.int64,
            "parent": torch.int64,
            "position": torch.int64,
            "role": torch.int64,
            "trainable": torch.bool,
            "rollout_logprob": torch.float32,
            "policy_version": torch.int64,
            "execution": torch.int64,
            "segment_parent": torch.int64,
            "leaf_reward": torch.float32,
        }
        for name, dtype in expected.items():
            x = getattr(self, name)
            if not isinstance(x, Tensor):
                raise BatchValidationError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")
            if x.dim() != 1 or x.numel() != t:
                raise BatchValidationError(f"{name}: expected shape [{t}], got {list(x.shape)}")
            if x.dtype != dtype:
                raise BatchValidationError(f"{name}: expected dtype {dtype}, got {x.dtype}")
        e = self.num_executions
        if len(self.task_family) != e:
            raise BatchValidationError(
                f"task_family has {len(self.task_family)} entries, execution_ids has {e}; expected equal"
            )
        if self.weight is not None:
            w = self.weight
            if not isinstance(w, Tensor) or w.dim() != 1 or w.numel() != t:
                raise BatchValidationError(f"weight: expected a tensor of shape [{t}] or None")
            if w.dtype not in (torch.float32, torch.float64):
                raise BatchValidationError(f"weight: expected dtype float32 or float64, got {w.dtype}")
            if not bool((torch.isfinite(w) & (w >= 0)).all()):
                raise BatchValidationError("weight: expected finite weights >= 0")
        if len(set(self.execution_ids)) != e:
            raise BatchValidationError("execution_ids must be unique")
        if t == 0:
            return
        idx = torch.arange(t, device=self.device)

        def bad(cond: Tensor, msg: str) -> None:
            if bool(cond.any()):
                first = int(cond.nonzero()[0, 0])
                raise BatchValidationError(f"token {first}: {msg} ({int(cond.sum())} token(s) affected)")

        bad((self.parent < -1) | (self.parent >= idx), "parent must be -1 or an earlier token index")
        bad(
            (self.segment_parent < -1) | (self.segment_parent >= idx),
            "segment_parent must be -1 or an earlier token index",
        )
        bad((self.role < PROMPT) | (self.role > SUMMARY), "role must be 0 (prompt) .. 3 (summary)")
        bad((self.execution < 0) | (self.execution >= e), f"execution must index the {e} executions")
        root = self.parent < 0
        p = self.parent.clamp(min=0)
        bad(root & (self.position != 0), "a context root must have position 0")
        bad(~root & (self.position != self.position[p] + 1), "position must be position[parent] + 1")
        bad(~root & (self.execution != self.execution[p]), "a token must belong to its parent's execution")
        sp = self.segment_parent
        has_sp = sp >= 0
        spc = sp.clamp(min=0)
        bad(has_sp & (self.role[spc] != SUMMARY), "segment_parent must point at a summary token")
        bad(has_sp & (self.execution[spc] != self.execution), "segment_parent must be in the same execution")
        model_out = torch.isin(self.role, torch.tensor(sorted(trainable_roles()), device=self.device))
        bad(self.trainable & ~model_out, "only action and summary tokens can be trainable")
        bad(self.trainable & root, "a context root cannot be trainable (no context to score it)")
        bad(~torch.isfinite(self.rollout_logprob), "rollout_logprob must be finite")
        bad(~self.trainable & (self.rollout_logprob != 0), "rollout_logprob must be 0 where not trainable")
        bad(self.trainable & (self.rollout_logprob > 1e-4), "rollout_logprob must be <= 0 (a log-probability)")
        bad(self.trainable & (self.policy_version < 0), "a trainable token needs its policy_version (>= 0)")
        bad(~model_out & (self.policy_version != -1), "policy_version must be -1 on prompt/observation tokens")
        leaf = self.is_leaf()
        finite = torch.isfinite(self.leaf_reward)
        bad(leaf & ~finite, "a logical leaf (end of a trajectory) needs a finite leaf_reward")
        bad(~leaf & ~torch.isnan(self.leaf_reward), "leaf_reward must be NaN except at logical leaves")
        if jmax is not None:
            n = self.trajectories_per_execution()
            over = n > jmax
            if bool(over.any()):
                k = int(over.nonzero()[0, 0])
                raise BatchValidationError(
                    f"execution {self.execution_ids[k]!r} has {int(n[k])} trajectories; Jmax is {jmax}"
                )


_TENSOR_FIELDS = (
    "tokens",
    "parent",
    "position",
    "role",
    "trainable",
    "rollout_logprob",
    "policy_version",
    "execution",
    "segment_parent",
    "leaf_reward",
)


# ---------------------------------------------------------------------- builder
class TreeBatchBuilder:
    """Build a ``TreeBatch`` run by run (tests, examples, small adapters).

    ``add_run`` appends a run of tokens below an existing token and returns the
    index of the run's last token, so forks are simply several runs under one parent.
    """

    def __init__(self) -> None:
        self._cols: dict[str, list[Any]] = {name: [] for name in _TENSOR_FIELDS}
        self._families: list[str] = []
        self._ids: list[str] = []

    def __len__(self) -> int:
        return len(self._cols["tokens"])

    def add_execution(self, execution_id: str, task_family: str = "synthetic") -> int:
        """Register an execution; returns its index."""
        self._ids.append(execution_id)
        self._families.append(task_family)
        return len(self._ids) - 1

    def add_run(
        self,
        execution: int,
        parent: int,
        tokens: Sequence[int],
        role: int,
        *,
        trainable: bool | None = None,
        logprobs: Sequence[float] | None = None,
        policy_version: int = 0,
        segment_parent: int = -1,
        reward: float | None = None,
    ) -> int:
        """Append ``tokens`` as a chain below token ``parent`` (-1: a new context root).

        Args:
            execution: execution index from ``add_execution``.
            parent: context parent of the run's first token, or -1.
            tokens: token ids of the run (at least one).
            role: role of every token of the run.
            trainable: default True for action/summary runs, False otherwise.
            logprobs: rollout log-probs of trainable tokens (default 0.0).
            policy_version: version for action/summary runs (ignored for other roles).
            segment_parent: set on the run's first token (a new segment's start).
            reward: leaf reward, set on the run's last token.

        Returns:
            Index of the run's last token.
        """
        if not tokens:
            raise ValueError("a run needs at least one token")
        model_out = role in trainable_roles()
        train = model_out if trainable is None else trainable
        n = len(tokens)
        if logprobs is not None and len(logprobs) != n:
            raise ValueError(f"logprobs has {len(logprobs)} entries for {n} tokens")
        start = len(self)
        pos0 = 0 if parent < 0 else self._cols["position"][parent] + 1
        c = self._cols
        c["tokens"].extend(int(x) for x in tokens)
        c["parent"].extend([parent, *range(start, start + n - 1)])
        c["position"].extend(range(pos0, pos0 + n))
        c["role"].extend([role] * n)
        c["trainable"].extend([train] * n)
        c["rollout_logprob"].extend([float(x) for x in logprobs] if (train and logprobs is not None) else [0.0] * n)
        c["policy_version"].extend([policy_version if model_out else -1] * n)
        c["execution"].extend([execution] * n)
        c["segment_parent"].extend([segment_parent] + [-1] * (n - 1))
        c["leaf_reward"].extend([math.nan] * (n - 1) + [math.nan if reward is None else float(reward)])
        return start + n - 1

    def set_reward(self, index: int, reward: float) -> None:
        """Set the leaf reward of token ``index`` (e.g. a trajectory that ends on an existing run)."""
        self._cols["leaf_reward"][index] = float(reward)

    def build(self) -> TreeBatch:
        """Materialize the tensors (does not validate; call ``validate()``)."""
        c = self._cols
        return TreeBatch(
            tokens=torch.tensor(c["tokens"], dtype=torch.int64),
            parent=torch.tensor(c["parent"], dtype=torch.int64),
            position=torch.tensor(c["position"], dtype=torch.int64),
            role=torch.tensor(c["role"], dtype=torch.int64),
            trainable=torch.tensor(c["trainable"], dtype=torch.bool),
            rollout_logprob=torch.tensor(c["rollout_logprob"], dtype=torch.float32),
            policy_version=torch.tensor(c["policy_version"], dtype=torch.int64),
            execution=torch.tensor(c["execution"], dtype=torch.int64),
            segment_parent=torch.tensor(c["segment_parent"], dtype=torch.int64),
            leaf_reward=torch.tensor(c["leaf_reward"], dtype=torch.float32),
            task_family=list(self._families),
            execution_ids=list(self._ids),
        )
