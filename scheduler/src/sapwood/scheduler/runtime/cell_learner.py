"""Training on the cells: the SAO step split into micro-batches that cells claim, over gloo.

Every cell of a run joins one gloo group (rank = its index; :meth:`GroupMember.join`). The *core*
(rank 0) owns the learner: the ``TorchBackend`` (optimizer state), the policy version and the
:class:`GroupSAOTrainer`, the project's SAO trainer whose joint update (``policy_update``) runs as a
group step. A step puts its batch, loss targets and micro-batch split into the group's ``TCPStore``
(``batch/<version>``), opens itself (``open`` = version), and accumulates micro-batch gradients until
every micro-batch is covered; then it applies the project's update (per-group clipping, AdamW steps,
version + 1) on the sum.

Micro-batches (real loss, exact split): the batch's trainable tokens are split into ``micro_batches``
contiguous chunks; micro-batch ``i`` is the SAO loss (``compute_losses``, token aggregation) with the
mask restricted to chunk ``i``, scaled by ``W_i / W`` (its share of the token weights), so the sum of
the micro-batch gradients is the whole batch's gradient (to float rounding). Each micro-batch's real
computation runs the batch's tree forward (the tree attention spans the packed batch) and back-
propagates its tokens' loss; its modelled device cost is ``train_microbatch_s`` on the computing cell's
:class:`~.device_clock.DeviceClock`.

Any cell in the ``train`` role claims micro-batches from the counter ``claim/<version>``: a *satellite*
(a non-core cell entering train, also in the middle of a step) pulls a versioned snapshot from the core
(``[PULL]`` → version + flat parameters), claims the rest of the *running* step's micro-batches and
sends ``[GRAD, rank, version, index]`` + the flat gradient. The core accepts a gradient only for the
open version and an uncovered micro-batch; a stale snapshot's gradient is refused (counted) and its
micro-batch computed by someone else. A member checks its role before each claim and finishes a
micro-batch it claimed (a device finishes the kernel it runs); one claimed as its role changed is released
to the group's *redo queue* (``redo/<version>/<k>`` in the store, taken with ``compare_set``), which every
train member, satellites included, drains before the claim counter, so a released micro-batch never
waits for the core. The core computes micro-batches itself only while it is in train, or when no
contribution arrived for ``stall_timeout_s`` (then it covers the rest alone).

The learner replicas are ``TorchBackend`` ``TinyActorCritic`` models, or with ``GroupSpec.learner_backend
= "megatron"`` megatron-core ``MegatronActorCritic`` models trained by a ``MegatronBackend`` (every cell
starts megatron's parallel state on the group's world with tensor parallel 1, and the core's backend does
not reduce over that world: the micro-batch gradients are the group's data parallelism). Snapshots and
gradients are flat vectors in the replica's own parameter order; weights leave the group in
``TinyActorCritic`` layout (:meth:`GroupMember.serving_state`), which rollout cells serve.

New weights reach rollout cells by a versioned broadcast in buckets: the core sends a header
``[WEIGHTS, version, buckets, numel]`` and the flat ``state_dict`` in buckets of ``bucket_numel``
floats to each receiving rank (tag 4); each receiver loads them as that version.
"""

from __future__ import annotations

import pickle
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from sapwood.learner.backends import check_backend, create_backend
from sapwood.learner.batch import TreeBatch
from sapwood.learner.config import LearnerConfig
from sapwood.learner.losses import metric_floats
from sapwood.learner.model import ActorCriticBackend, TinyActorCritic, tree_forward
from sapwood.learner.trainer import LossTargets, SAOTrainer, compute_losses
from sapwood.scheduler.runtime.device_clock import DeviceClock, DeviceCosts
from sapwood.scheduler.runtime.learners import GRAD, LEAVE, PULL, RELEASE, TAG_GRAD, TAG_HEADER, TAG_SNAPSHOT

__all__ = ["GroupMember", "GroupSAOTrainer", "GroupSpec", "GroupStats", "micro_gradient", "micro_split"]

WEIGHTS = 5
TAG_WEIGHTS = 4


@dataclass(frozen=True)
class GroupSpec:
    """One cell's place in the learner group: the store's port, its rank, the group's size."""

    port: int
    rank: int
    world: int
    micro_batches: int = 4
    stall_timeout_s: float = 2.0
    bucket_numel: int = 1 << 14
    """Floats per weight-broadcast bucket (64 KiB of float32)."""
    timeout_s: float = 3600.0
    learner_backend: str = "torch"
    """The replicas' backend, a name of ``sapwood.learner.backends`` (megatron: tensor parallel 1)."""

    def __post_init__(self) -> None:
        check_backend(self.learner_backend)


@dataclass
class GroupStats:
    """What the core saw: per version, micro-batches accepted per rank (0: the core itself); refusals
    ``(open version or -1, rank, version sent, index)``; releases; covered before the first satellite."""

    accepted: dict[int, dict[int, int]] = field(default_factory=dict)
    refused: list[tuple[int, int, int, int]] = field(default_factory=list)
    released: list[tuple[int, int, int]] = field(default_factory=list)
    first_satellite_after: dict[int, int] = field(default_factory=dict)
    progress: dict[int, int] = field(default_factory=dict)
    open: int = -1
    """The version of the step running now (-1: none)."""
    covered: int = 0
    """Micro-batches covered so far in the running step."""
    fallbacks: dict[int, float] = field(default_factory=dict)
    """Per version whose step stalled: seconds from the step's start until the core covered the rest alone."""


def micro_split(targets: LossTargets, micro_batches: int) -> tuple[list[torch.Tensor], list[float]]:
    """``(masks, shares)``: [N] bool masks of ``micro_batches`` contiguous chunks of the trainable tokens
    and each chunk's share ``W_i / W`` of the token weights (Σ shares = 1; 0 for an empty chunk)."""
    idx = targets.mask.nonzero().flatten()
    w = targets.mask.double() if targets.weight is None else targets.weight.double() * targets.mask.double()
    total = float(w.sum())
    masks, shares = [], []
    for chunk in torch.tensor_split(idx, micro_batches):
        m = torch.zeros_like(targets.mask)
        m[chunk] = True
        masks.append(m)
        shares.append(float(w[chunk].sum()) / total if total > 0 else 0.0)
    return masks, shares


def flat_grad(model: torch.nn.Module) -> torch.Tensor:
    """[P] every parameter's gradient, in ``parameters()`` order (zeros where none)."""
    return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                      for p in model.parameters()]).detach()


def micro_gradient(model: torch.nn.Module, batch: TreeBatch, targets: LossTargets, config: LearnerConfig,
                   mask: torch.Tensor, share: float) -> torch.Tensor:
    """[P] gradient of ``share`` × the SAO loss (policy + value) over the tokens of ``mask`` ([T] bool). The
    forward runs over those tokens and their context ancestors only (``TreeBatch.context_view``), not the
    whole batch: the same outputs for them, a fraction of the batch's attention and backward."""
    model.train()
    model.zero_grad(set_to_none=True)
    if share == 0.0:
        return torch.cat([torch.zeros_like(p).reshape(-1) for p in model.parameters()])
    view, index = batch.context_view(mask)
    local = replace(targets.select(index, targets.weight[index] if targets.weight is not None else None),
                    mask=mask[index])
    loss, _ = compute_losses(tree_forward(model, view), local, config, policy=True)
    (loss * share).backward()
    return flat_grad(model)


def _header(kind: int, rank: int, version: int, index: int) -> torch.Tensor:
    return torch.tensor([kind, rank, version, index], dtype=torch.int64)


class GroupMember:
    """One cell in the learner group; ``role()`` reads the cell's role, ``clock`` / ``costs()`` its device."""

    def __init__(self, spec: GroupSpec, model_config: Any, clock: DeviceClock, costs: Callable[[], DeviceCosts],
                 role: Callable[[], str]) -> None:
        self.spec, self.model_config, self.clock, self.costs, self.role = spec, model_config, clock, costs, role
        self.is_core = spec.rank == 0
        self.store: Any = None
        self.stats = GroupStats()
        self.sent = 0
        self._claims = 0
        self.trainer: GroupSAOTrainer | None = None
        self._inbox: queue.Queue[tuple[tuple[int, int, int, int], torch.Tensor | None]] = queue.Queue()
        self._snapshot: tuple[int, torch.Tensor] | None = None
        self._snap_lock = threading.Lock()
        self._step_lock = threading.Lock()
        self._open = -1
        self._satellite: threading.Thread | None = None

    # -- group ---------------------------------------------------------------------------------------
    def join(self) -> None:
        """Join the gloo group (blocks until every rank joined); the core starts its inbox thread."""
        timeout = timedelta(seconds=self.spec.timeout_s)
        self.store = dist.TCPStore("127.0.0.1", self.spec.port, self.spec.world, is_master=self.is_core,
                                   timeout=timeout)
        dist.init_process_group("gloo", store=self.store, rank=self.spec.rank, world_size=self.spec.world,
                                timeout=timeout)
        if self.spec.learner_backend == "megatron":  # a collective: every rank creates megatron's groups
            from sapwood.learner.megatron_parallel import init_parallel

            init_parallel(1)
        if self.is_core:
            self.store.set("open", "-1")
            threading.Thread(target=self._receive, name="core-inbox", daemon=True).start()

    def new_model(self) -> nn.Module:
        """A learner replica's model (this group's backend; weights to be loaded or pulled)."""
        if self.spec.learner_backend == "megatron":
            from sapwood.learner.megatron_model import MegatronActorCritic

            return MegatronActorCritic(self.model_config)
        return TinyActorCritic(self.model_config)

    def _numel(self) -> int:
        return sum(p.numel() for p in self.new_model().parameters())

    def _receive(self) -> None:
        """Core: receive headers from any rank; answer pulls at once with the newest snapshot."""
        numel = self._numel()
        while True:
            header = torch.zeros(4, dtype=torch.int64)
            dist.recv(header, tag=TAG_HEADER)
            kind, rank, version, index = (int(v) for v in header.tolist())
            if kind == PULL:
                with self._snap_lock:
                    snap = self._snapshot
                v, flat = snap if snap is not None else (-1, torch.zeros(numel))
                dist.send(torch.tensor([float(v)], dtype=torch.float64), dst=rank, tag=TAG_SNAPSHOT)
                dist.send(flat, dst=rank, tag=TAG_SNAPSHOT)
                continue
            grad = None
            if kind == GRAD:
                grad = torch.empty(numel)
                dist.recv(grad, src=rank, tag=TAG_GRAD)
            if kind != LEAVE:
                self._inbox.put(((kind, rank, version, index), grad))

    # -- core: the step --------------------------------------------------------------------------------
    def start_trainer(self, config: LearnerConfig, state: dict[str, Any], seed: int) -> GroupSAOTrainer:
        """Core: the learner replica that owns the optimizer and the policy version."""
        torch.manual_seed(seed)
        # a megatron replica is not data parallel with the group's world: the micro-batches are its data parallelism
        options = {"data_parallel": False} if self.spec.learner_backend == "megatron" else {}
        backend = create_backend(self.spec.learner_backend, self.model_config, config, init_state=state, **options)
        assert isinstance(backend, ActorCriticBackend)
        self.trainer = GroupSAOTrainer(backend, config, self)
        self._publish_snapshot()
        return self.trainer

    def _flat_params(self) -> torch.Tensor:
        assert self.trainer is not None
        return torch.nn.utils.parameters_to_vector(self.trainer.group_backend.model.parameters()).detach().clone()

    def _publish_snapshot(self) -> None:
        assert self.trainer is not None
        with self._snap_lock:
            self._snapshot = (self.trainer.group_backend.policy_version, self._flat_params())

    def _handle(self, msg: tuple[tuple[int, int, int, int], torch.Tensor | None], version: int,
                accum: torch.Tensor, covered: set[int]) -> None:
        (kind, rank, sent_version, index), grad = msg
        if kind == GRAD and grad is not None:
            if sent_version == version and 0 <= index < self.spec.micro_batches and index not in covered:
                self.stats.first_satellite_after.setdefault(version, len(covered))
                accum += grad
                covered.add(index)
                acc = self.stats.accepted.setdefault(version, {})
                acc[rank] = acc.get(rank, 0) + 1
            else:
                self.stats.refused.append((version, rank, sent_version, index))
        elif kind == RELEASE:
            self.stats.released.append((version, rank, index))
            if sent_version == version and index not in covered:
                self._publish_redo(version, index)

    # -- claims: a released micro-batch first (any train member takes it), then the step's counter ---------
    def _publish_redo(self, version: int, index: int) -> None:
        """Core: put released micro-batch ``index`` of step ``version`` on the group's redo queue."""
        k = int(self.store.add(f"redo_n/{version}", 1)) - 1
        self.store.set(f"redo_index/{version}/{k}", str(index))
        self.store.set(f"redo/{version}/{k}", "open")

    def _claim(self, version: int, *, counter: bool = True) -> int | None:
        """The next micro-batch of step ``version`` for this member: an open entry of the redo queue (taken
        atomically with ``compare_set``), else the step's claim counter (≥ ``micro_batches``: none left);
        ``None`` when the queue has nothing open and ``counter`` is False."""
        for k in range(int(self.store.add(f"redo_n/{version}", 0))):
            # compare_set returns the value after it: ours only if this call swapped "open" for it
            self._claims += 1
            me = f"rank-{self.spec.rank}-{self._claims}"
            if self.store.compare_set(f"redo/{version}/{k}", "open", me) == me.encode():
                return int(self.store.get(f"redo_index/{version}/{k}"))
        return int(self.store.add(f"claim/{version}", 1)) - 1 if counter else None

    def run_step(self, batch: TreeBatch, targets: LossTargets, config: LearnerConfig) -> dict[str, float]:
        """Core: one joint update of ``batch`` over the group's micro-batches; returns the update's metrics."""
        assert self.trainer is not None
        backend = self.trainer.group_backend
        model = backend.model
        m = self.spec.micro_batches
        with self._step_lock:
            version = backend.policy_version
            masks, shares = micro_split(targets, m)
            self.store.set(f"batch/{version}", pickle.dumps((batch, targets, config, masks, shares)))
            self._publish_snapshot()
            self._open = self.stats.open = version
            self.stats.covered = 0
            self.store.set("open", str(version))
            accum = torch.zeros_like(self._flat_params())
            covered: set[int] = set()
            redo: list[int] = []  # the core's own list once the step stalled: every uncovered micro-batch
            self.stats.accepted.setdefault(version, {})
            last = started = time.monotonic()
            fallback = exhausted = False
            while len(covered) < m:
                try:
                    msg = self._inbox.get_nowait()
                except queue.Empty:
                    msg = None
                if msg is not None:
                    before = len(covered)
                    self._handle(msg, version, accum, covered)
                    if len(covered) > before:
                        last = time.monotonic()
                        self.stats.covered = len(covered)
                    self.store.set(f"progress/{version}", str(len(covered)))
                    continue
                if not fallback and time.monotonic() - last > self.spec.stall_timeout_s:
                    fallback = True
                    self.stats.fallbacks[version] = time.monotonic() - started
                if self.role() != "train" and not fallback:
                    time.sleep(0.002)
                    continue
                claimed = redo.pop() if redo else self._claim(version, counter=not exhausted)
                if claimed is None or claimed >= m:  # counter spent, redo queue empty: wait, or cover the rest
                    exhausted = True
                    if fallback:
                        redo.extend(i for i in range(m) if i not in covered and i not in redo)
                    else:
                        time.sleep(0.002)
                    continue
                if claimed not in covered:
                    t0 = time.monotonic()
                    accum += micro_gradient(model, batch, targets, config, masks[claimed], shares[claimed])
                    self.clock.charge(self.costs().train_microbatch_s, t0)
                    covered.add(claimed)
                    acc = self.stats.accepted[version]
                    acc[0] = acc.get(0, 0) + 1
                    last = time.monotonic()
                    self.stats.covered = len(covered)
                    self.store.set(f"progress/{version}", str(len(covered)))
            self.stats.progress[version] = len(covered)
            self._open = self.stats.open = -1
            self.store.set("open", "-1")
            with torch.no_grad():  # the metrics at the snapshot's parameters, as TorchBackend.step reports
                loss, metrics = compute_losses(tree_forward(model, batch), targets, config, policy=True)
            offset = 0
            for p in model.parameters():
                p.grad = accum[offset: offset + p.numel()].view_as(p).clone()
                offset += p.numel()
            out: dict[str, Any] = {**metrics, "train/loss": loss}
            backend._update(out, update_actor=True, update_critic=True)
            self._publish_snapshot()
            self.store.set("version", str(backend.policy_version))
            return metric_floats(out)

    def refuse_pending(self) -> None:
        """Core, between steps: refuse what arrived for a step that is closed (stale snapshots)."""
        if not self._step_lock.acquire(blocking=False):
            return
        try:
            while True:
                try:
                    msg = self._inbox.get_nowait()
                except queue.Empty:
                    return
                (kind, rank, version, index), _ = msg
                if kind == GRAD:
                    self.stats.refused.append((-1, rank, version, index))
        finally:
            self._step_lock.release()

    # -- satellites ------------------------------------------------------------------------------------
    def on_role(self, role: str) -> None:
        """A non-core cell entering train starts its satellite loop (it leaves when the role changes)."""
        if self.is_core or role != "train" or self.store is None:
            return
        if self._satellite is not None and self._satellite.is_alive():
            return
        self._satellite = threading.Thread(target=self._satellite_loop, name="satellite", daemon=True)
        self._satellite.start()

    def _pull(self, numel: int) -> tuple[int, torch.Tensor]:
        dist.send(_header(PULL, self.spec.rank, -1, -1), dst=0, tag=TAG_HEADER)
        v = torch.zeros(1, dtype=torch.float64)
        flat = torch.empty(numel)
        dist.recv(v, src=0, tag=TAG_SNAPSHOT)
        dist.recv(flat, src=0, tag=TAG_SNAPSHOT)
        return int(v.item()), flat

    def _satellite_loop(self) -> None:
        model = self.new_model()
        numel = sum(p.numel() for p in model.parameters())
        done: set[int] = set()
        while self.role() == "train":
            open_version = int(self.store.get("open"))
            if open_version < 0 or open_version in done:
                time.sleep(0.005)
                continue
            version, flat = self._pull(numel)
            done.add(open_version)
            if version < 0 or not self.store.check([f"batch/{version}"]):
                continue
            done.add(version)
            batch, targets, config, masks, shares = pickle.loads(self.store.get(f"batch/{version}"))
            torch.nn.utils.vector_to_parameters(flat, model.parameters())
            self._satellite_step(model, version, batch, targets, config, masks, shares)

    def _satellite_step(self, model: nn.Module, version: int, batch: TreeBatch, targets: LossTargets,
                        config: LearnerConfig, masks: list[torch.Tensor], shares: list[float]) -> None:
        """Claim and compute micro-batches of step ``version`` while in train and the step is open: the
        role is checked before each claim and a claimed micro-batch is finished (a device finishes the
        kernel it runs); one claimed as the role changed is released to the redo queue; once the counter
        is spent, released micro-batches are still taken until the step closes."""
        exhausted = False
        while self.role() == "train" and int(self.store.get("open")) == version:
            index = self._claim(version, counter=not exhausted)
            if index is None:
                time.sleep(0.005)
                continue
            if index >= len(masks):
                exhausted = True
                continue
            if self.role() != "train":
                dist.send(_header(RELEASE, self.spec.rank, version, index), dst=0, tag=TAG_HEADER)
                return
            t0 = time.monotonic()
            grad = micro_gradient(model, batch, targets, config, masks[index], shares[index])
            self.clock.charge(self.costs().train_microbatch_s, t0)
            dist.send(_header(GRAD, self.spec.rank, version, index), dst=0, tag=TAG_HEADER)
            dist.send(grad, dst=0, tag=TAG_GRAD)
            self.sent += 1

    # -- weights ---------------------------------------------------------------------------------------
    def serving_state(self) -> dict[str, torch.Tensor]:
        """Core: the replica's weights in ``TinyActorCritic`` layout (what rollout cells serve), detached."""
        assert self.trainer is not None
        backend = self.trainer.group_backend
        if self.spec.learner_backend == "megatron":  # in TinyActorCritic's key order, as receivers unflatten
            return dict(backend.tiny_state_dict())  # type: ignore[attr-defined]
        return {k: v.detach().clone() for k, v in backend.model.state_dict().items()}

    def broadcast(self, ranks: list[int]) -> int:
        """Core: send the newest weights to ``ranks`` (a versioned header, then buckets); returns the version."""
        assert self.trainer is not None
        state = self.serving_state()
        version = self.trainer.group_backend.policy_version
        flat = torch.cat([t.detach().reshape(-1).float() for t in state.values()])
        buckets = torch.split(flat, self.spec.bucket_numel)
        header = _header(WEIGHTS, version, len(buckets), flat.numel())
        for r in ranks:
            dist.send(header, dst=r, tag=TAG_WEIGHTS)
            for b in buckets:
                dist.send(b.contiguous(), dst=r, tag=TAG_WEIGHTS)
        return version

    def receive(self, like: dict[str, torch.Tensor]) -> tuple[int, dict[str, torch.Tensor]]:
        """A rollout cell: receive one broadcast; returns ``(version, state_dict shaped like like)``."""
        header = torch.zeros(4, dtype=torch.int64)
        dist.recv(header, src=0, tag=TAG_WEIGHTS)
        kind, version, n, numel = (int(v) for v in header.tolist())
        if kind != WEIGHTS:
            raise RuntimeError(f"expected a weights header, got kind {kind}")
        parts = []
        left = numel
        for _ in range(n):
            b = torch.empty(min(self.spec.bucket_numel, left))
            dist.recv(b, src=0, tag=TAG_WEIGHTS)
            parts.append(b)
            left -= b.numel()
        flat = torch.cat(parts)
        state, offset = {}, 0
        for k, t in like.items():
            state[k] = flat[offset: offset + t.numel()].view_as(t).to(t.dtype).clone()
            offset += t.numel()
        return version, state


class GroupSAOTrainer(SAOTrainer):
    """The project's SAO trainer whose joint update runs as a group step over the cells' micro-batches."""

    def __init__(self, backend: ActorCriticBackend, config: LearnerConfig, member: GroupMember) -> None:
        super().__init__(backend, config)
        self.group_backend = backend
        self.member = member

    def policy_update(self, batch: TreeBatch, targets: LossTargets) -> dict[str, float]:
        return self.member.run_step(batch, targets, self.config)
