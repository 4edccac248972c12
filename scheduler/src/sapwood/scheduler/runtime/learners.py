"""Core and satellite learners over torch.distributed (gloo on CPU, NCCL on GPU).

The core (rank 0) holds the authoritative parameters, the optimizer state and a version (the number
of steps taken). One step averages the gradients of a batch's ``micro_batches`` micro-batches and
takes one optimizer step. Micro-batches are claimed one at a time from a counter in the group's
``TCPStore`` (``claim/<version>``), by the core and by any satellite taking part, so a satellite can
join or leave in the middle of a batch; whatever no one computed, the core computes.

A satellite pulls a snapshot (``version`` + flat parameters) from the core, computes the gradient of
each micro-batch it claims on that snapshot, and sends ``[GRAD, rank, version, index]`` followed by
the flat gradient. The core accepts it only when ``version`` is the current one and the micro-batch
is not covered yet; otherwise the contribution is refused (counted) and the core recomputes that
micro-batch. Because each micro-batch's gradient is computed on the same parameters whoever computes
it, the step equals the fixed-set computation up to the order of the floating-point sum.

Messages use tags: headers 1 (received from any source), gradients 2, snapshots 3.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["CoreStats", "GroupConfig", "SatellitePlan", "core_loop", "micro_batch", "reference_steps", "run_group",
           "satellite_loop", "small_model"]

PULL, GRAD, RELEASE, LEAVE = 1, 2, 3, 4
TAG_HEADER, TAG_GRAD, TAG_SNAPSHOT = 1, 2, 3


@dataclass(frozen=True)
class GroupConfig:
    """A learner group: ``steps`` steps of ``micro_batches`` micro-batches of ``rows`` rows each."""

    steps: int = 3
    micro_batches: int = 8
    rows: int = 16
    lr: float = 0.05
    seed: int = 0
    compute_delay_s: float = 0.0
    """Sleep per micro-batch gradient, standing in for a bigger model's compute (0: none)."""
    stall_timeout_s: float = 5.0
    """The core recomputes uncovered micro-batches when nothing arrives for this long (a satellite that
    claimed one and vanished without releasing it)."""


@dataclass(frozen=True)
class SatellitePlan:
    """What one satellite does: join step ``join_step`` after the core covered ``join_after`` micro-batches;
    leave during ``leave_step`` after ``leave_after`` contributions (releasing one claimed micro-batch);
    ``stale``: pull at ``join_step``, then contribute to the next step with that old snapshot."""

    join_step: int = 0
    join_after: int = 0
    leave_step: int | None = None
    leave_after: int = 1
    stale: bool = False


@dataclass
class CoreStats:
    """What the core saw; ``params`` holds the flat parameters after each step."""

    accepted: dict[int, dict[int, int]] = field(default_factory=dict)
    """step → rank → micro-batches accepted from that rank (0: the core itself)."""
    refused: list[tuple[int, int, int, int]] = field(default_factory=list)
    """(step, rank, version sent, micro-batch) of each refused contribution."""
    released: list[tuple[int, int, int]] = field(default_factory=list)
    first_satellite_after: dict[int, int] = field(default_factory=dict)
    """step → micro-batches covered before the first satellite contribution arrived."""
    params: list[torch.Tensor] = field(default_factory=list)


def small_model(seed: int) -> torch.nn.Module:
    """An 8→16→1 tanh MLP in float64 (real math, fast)."""
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1)).double()


def micro_batch(cfg: GroupConfig, step: int, index: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Micro-batch ``index`` of step ``step``: inputs [rows, 8] and targets [rows, 1] (float64)."""
    g = torch.Generator().manual_seed(cfg.seed * 1_000_003 + step * 1009 + index)
    x = torch.randn(cfg.rows, 8, generator=g, dtype=torch.float64)
    y = torch.sin(x.sum(dim=1, keepdim=True)) + 0.1 * torch.randn(cfg.rows, 1, generator=g, dtype=torch.float64)
    return x, y


def gradient(model: torch.nn.Module, flat: torch.Tensor, cfg: GroupConfig, step: int, index: int) -> torch.Tensor:
    """Flat gradient of the mean-squared error of one micro-batch at parameters ``flat``."""
    torch.nn.utils.vector_to_parameters(flat, model.parameters())
    model.zero_grad(set_to_none=True)
    x, y = micro_batch(cfg, step, index)
    torch.nn.functional.mse_loss(model(x), y).backward()
    if cfg.compute_delay_s > 0:
        time.sleep(cfg.compute_delay_s)
    return torch.cat([p.grad.reshape(-1) for p in model.parameters() if p.grad is not None])


def _optimizer(model: torch.nn.Module, cfg: GroupConfig) -> torch.optim.Optimizer:
    return torch.optim.Adam(model.parameters(), lr=cfg.lr)


def _apply(model: torch.nn.Module, opt: torch.optim.Optimizer, flat: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    torch.nn.utils.vector_to_parameters(flat, model.parameters())
    offset = 0
    for p in model.parameters():
        n = p.numel()
        p.grad = grad[offset: offset + n].view_as(p).clone()
        offset += n
    opt.step()
    return torch.nn.utils.parameters_to_vector(model.parameters()).detach().clone()


def reference_steps(cfg: GroupConfig) -> list[torch.Tensor]:
    """The fixed-set computation: one process, every micro-batch, the same optimizer."""
    model = small_model(cfg.seed)
    opt = _optimizer(model, cfg)
    flat = torch.nn.utils.parameters_to_vector(model.parameters()).detach().clone()
    out = []
    for step in range(cfg.steps):
        grads = [gradient(model, flat, cfg, step, i) for i in range(cfg.micro_batches)]
        flat = _apply(model, opt, flat, torch.stack(grads).sum(0) / cfg.micro_batches)
        out.append(flat.clone())
    return out


def _header(kind: int, rank: int, version: int, index: int) -> torch.Tensor:
    return torch.tensor([kind, rank, version, index], dtype=torch.int64)


class _Inbox:
    """Receives headers from any satellite (and the gradient after a GRAD header) on a thread.

    gloo's non-blocking any-source receive never reports completion, so a thread blocks in
    ``recv`` instead; it ends after a LEAVE from every satellite.
    """

    def __init__(self, numel: int, satellites: int) -> None:
        import queue
        import threading

        self.messages: queue.Queue[tuple[tuple[int, int, int, int], torch.Tensor | None]] = queue.Queue()
        self.numel, self.satellites = numel, satellites
        self.thread = threading.Thread(target=self._run, name="core-inbox", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        left = 0
        while left < self.satellites:
            header = torch.zeros(4, dtype=torch.int64)
            dist.recv(header, tag=TAG_HEADER)
            kind, rank, version, index = (int(v) for v in header.tolist())
            grad = None
            if kind == GRAD:
                grad = torch.empty(self.numel, dtype=torch.float64)
                dist.recv(grad, src=rank, tag=TAG_GRAD)
            left += kind == LEAVE
            self.messages.put(((kind, rank, version, index), grad))

    def poll(self) -> tuple[tuple[int, int, int, int], torch.Tensor | None] | None:
        import queue

        try:
            return self.messages.get_nowait()
        except queue.Empty:
            return None


def _send_snapshot(rank: int, version: int, flat: torch.Tensor) -> None:
    dist.send(torch.tensor([float(version)], dtype=torch.float64), dst=rank, tag=TAG_SNAPSHOT)
    dist.send(flat, dst=rank, tag=TAG_SNAPSHOT)


def core_loop(cfg: GroupConfig, store: dist.Store, world_size: int) -> CoreStats:
    """Rank 0: run ``cfg.steps`` steps, serving snapshots and taking contributions; returns what it saw."""
    model = small_model(cfg.seed)
    opt = _optimizer(model, cfg)
    flat = torch.nn.utils.parameters_to_vector(model.parameters()).detach().clone()
    stats = CoreStats()
    inbox = _Inbox(flat.numel(), world_size - 1)
    store.set("version", "0")
    for step in range(cfg.steps):
        accum = torch.zeros_like(flat)
        covered: set[int] = set()
        redo: list[int] = []
        accepted = stats.accepted.setdefault(step, {})
        last_arrival = time.monotonic()
        while len(covered) < cfg.micro_batches:
            msg = inbox.poll()
            if msg is not None:
                (kind, rank, version, index), grad = msg
                last_arrival = time.monotonic()
                if kind == PULL:
                    _send_snapshot(rank, step, flat)
                elif kind == GRAD and grad is not None:
                    if version == step and 0 <= index < cfg.micro_batches and index not in covered:
                        stats.first_satellite_after.setdefault(step, len(covered))
                        accum += grad
                        covered.add(index)
                        accepted[rank] = accepted.get(rank, 0) + 1
                        store.set(f"progress/{step}", str(len(covered)))
                    else:
                        stats.refused.append((step, rank, version, index))
                        if version != step and step == version + 1 and 0 <= index < cfg.micro_batches:
                            redo.append(index)  # claimed in this step on an old snapshot: recompute it here
                elif kind == RELEASE:
                    stats.released.append((step, rank, index))
                    if version == step and index not in covered:
                        redo.append(index)
                continue
            index = redo.pop() if redo else int(store.add(f"claim/{step}", 1)) - 1
            if index < cfg.micro_batches:
                if index in covered:
                    continue
                accum += gradient(model, flat, cfg, step, index)
                covered.add(index)
                accepted[0] = accepted.get(0, 0) + 1
                store.set(f"progress/{step}", str(len(covered)))
            elif time.monotonic() - last_arrival > cfg.stall_timeout_s:
                redo.extend(i for i in range(cfg.micro_batches) if i not in covered)
            else:
                time.sleep(0.001)
        flat = _apply(model, opt, flat, accum / cfg.micro_batches)
        stats.params.append(flat.clone())
        store.set("version", str(step + 1))
    store.set("done", "1")
    # Answer late pulls until every satellite has left (a pull after the last step gets the final version).
    while inbox.thread.is_alive() or not inbox.messages.empty():
        msg = inbox.poll()
        if msg is None:
            time.sleep(0.001)
            continue
        (kind, rank, version, index), _ = msg
        if kind == PULL:
            _send_snapshot(rank, cfg.steps, flat)
        elif kind == GRAD:
            stats.refused.append((cfg.steps, rank, version, index))
    return stats


def _wait_for(cond: Callable[[], bool], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError("satellite waited too long for the core")
        time.sleep(0.002)


def satellite_loop(cfg: GroupConfig, store: dist.Store, rank: int, plan: SatellitePlan) -> int:
    """A satellite following ``plan``; returns the number of gradients it sent."""
    model = small_model(cfg.seed)
    numel = sum(p.numel() for p in model.parameters())

    def version() -> int:
        return int(store.get("version"))

    def progress(step: int) -> int:
        return int(store.get(f"progress/{step}")) if store.check([f"progress/{step}"]) else 0

    def pull() -> tuple[int, torch.Tensor]:
        dist.send(_header(PULL, rank, -1, -1), dst=0, tag=TAG_HEADER)
        v = torch.zeros(1, dtype=torch.float64)
        flat = torch.empty(numel, dtype=torch.float64)
        dist.recv(v, src=0, tag=TAG_SNAPSHOT)
        dist.recv(flat, src=0, tag=TAG_SNAPSHOT)
        return int(v.item()), flat

    sent = 0
    try:
        _wait_for(lambda: store.check(["version"]) and version() >= plan.join_step)
        _wait_for(lambda: progress(plan.join_step) >= plan.join_after or version() > plan.join_step)
        snap_version, flat = pull()
        if plan.stale:
            _wait_for(lambda: version() > snap_version or store.check(["done"]))
            index = int(store.add(f"claim/{version()}", 1)) - 1
            if index < cfg.micro_batches and not store.check(["done"]):
                g = gradient(model, flat, cfg, version(), index)  # this step's data, the old snapshot
                dist.send(_header(GRAD, rank, snap_version, index), dst=0, tag=TAG_HEADER)
                dist.send(g, dst=0, tag=TAG_GRAD)
                sent += 1
            return sent
        in_step = 0
        while snap_version < cfg.steps:
            index = int(store.add(f"claim/{snap_version}", 1)) - 1
            if index >= cfg.micro_batches:  # nothing left in this batch: wait for the next snapshot
                _wait_for(lambda v=snap_version: version() > v)  # type: ignore[misc]
                if store.check(["done"]):
                    return sent
                snap_version, flat = pull()
                in_step = 0
                continue
            if plan.leave_step == snap_version and in_step >= plan.leave_after:
                dist.send(_header(RELEASE, rank, snap_version, index), dst=0, tag=TAG_HEADER)
                return sent
            g = gradient(model, flat, cfg, snap_version, index)
            dist.send(_header(GRAD, rank, snap_version, index), dst=0, tag=TAG_HEADER)
            dist.send(g, dst=0, tag=TAG_GRAD)
            sent += 1
            in_step += 1
        return sent
    finally:
        dist.send(_header(LEAVE, rank, -1, -1), dst=0, tag=TAG_HEADER)


def run_rank(rank: int, world_size: int, port: int, cfg: GroupConfig, plans: list[SatellitePlan], out: Any) -> None:
    """Entry point of one spawned process: init the gloo group on ``port`` and run the core or a satellite."""
    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, world_size, is_master=rank == 0, timeout=timedelta(seconds=120))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size, timeout=timedelta(seconds=120))
    try:
        if rank == 0:
            stats = core_loop(cfg, store, world_size)
            # tensors through a queue travel as shared memory that dies with this process: send arrays
            params, stats.params = stats.params, []
            out.put(("core", (stats, [p.numpy() for p in params])))
        else:
            out.put((rank, satellite_loop(cfg, store, rank, plans[rank - 1])))
    except BaseException as exc:
        out.put((rank, exc))
        raise
    finally:
        dist.destroy_process_group()


def run_group(cfg: GroupConfig, plans: list[SatellitePlan], *,
              timeout_s: float = 180.0) -> tuple[CoreStats, dict[int, int]]:
    """Spawn a core and ``len(plans)`` satellites (separate processes, gloo); returns the core's stats and
    the gradients each satellite sent."""
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    world = len(plans) + 1
    procs = [ctx.Process(target=run_rank, args=(r, world, port, cfg, plans, out), daemon=True) for r in range(world)]
    for p in procs:
        p.start()
    results: dict[Any, Any] = {}
    try:
        for _ in range(world):
            key, value = out.get(timeout=timeout_s)
            if isinstance(value, BaseException):
                raise RuntimeError(f"learner rank {key} failed: {value!r}") from value
            results[key] = value
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.terminate()
    core, arrays = results.pop("core")
    core.params = [torch.from_numpy(a) for a in arrays]
    return core, {int(k): int(v) for k, v in results.items()}
