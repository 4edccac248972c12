"""Workload parameters and the documented presets.

Rollout durations are lognormal: median ``rollout_p50_s`` and tail heaviness ``tail_ratio`` = p99/p50,
so σ = ln(tail_ratio) / z₀.₉₉ (z₀.₉₉ = 2.3263). ``tail_ratio`` = 1 gives zero variance (every rollout
lasts exactly the median). A rollout holds one of its cell's ``slots_per_cell`` slots for its duration
(agentic rollouts are bound by environment time and KV-cache memory, not by decode throughput).
A training step costs ``train_cell_s_per_step`` cell-seconds, split evenly over the train cells
(data-parallel, linear scaling; satellites join a step mid-way), then ``train_step_serial_s`` seconds that
do not shrink with more train cells (the core's update and the weight broadcast; default 0). A move into
rollout takes ``switch_cost_s`` (weight load); a move into training takes ``join_cost_s`` (a satellite
pulling the parameters to join; ``None``: the same as ``switch_cost_s``).

Replayed durations (``durations_s``): a measured workload's per-rollout durations in admission order,
used instead of the lognormal draw (rollout ``i`` lasts ``durations_s[i]`` under every policy and seed; a
longer draw repeats them in order). ``rollout_p50_s`` still sets the completion-rate window and the timeout.

Core cells: the last ``core_cells`` cells hold the authoritative parameters and are pinned to training under
every policy that separates the roles (Elastic, Async; the simulator refuses a move of a core cell out of
training). Colocate is exempt: a colocated system holds the parameters on every cell by design.

Streaming gradient accumulation (``streaming_accumulation``): train cells work off each rollout's share of a
step (``train_cell_s_per_step / batch_size``) as soon as it is consumed, and the step ends when its whole batch
has been worked off; without it a step starts only when its whole batch has finished. It applies to every
policy that has train cells while rollouts run (Elastic, Async); Colocate cannot stream (no cell trains
while its batch is generated).

Rollout timeout: a rollout that has run ``timeout_factor × rollout_p50_s`` seconds (its own running time;
pauses by a shrinking pool do not count) is cut there and partial-scored (its credit is the fraction of its
work done, ``timeout / duration``). ``timeout_factor = inf`` disables the timeout.

Batch rule (``batch_rule``), i.e. which finished rollouts a training step consumes:

* ``exact`` (default): step ``v`` trains on exactly the rollouts admitted for it, indices
  ``[v·batch_size, (v+1)·batch_size)``, and waits until all of them have finished. With admission control
  this never trains a rollout more than ``max_staleness`` versions stale.
* ``first_finished``: step ``v`` trains on the first ``batch_size`` rollouts to finish. The staleness bound is
  enforced where the step consumes them: a rollout more than ``max_staleness`` versions stale is either
  dropped (``stale_rollouts="drop"``: not trained, a replacement rollout is admitted) or kept with weight
  ``stale_weight ** (staleness − max_staleness)`` (``stale_rollouts="discount"``).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace

import numpy as np

Z99 = 2.3263478740408408


@dataclass(frozen=True)
class Workload:
    """All parameters of one simulated cluster run (seconds, counts, tokens)."""

    cells: int = 8
    slots_per_cell: int = 4
    batch_size: int = 32
    steps: int = 8
    rollout_p50_s: float = 600.0
    tail_ratio: float = 4.0
    tokens_per_rollout: int = 100_000
    train_cell_s_per_step: float = 8 * 300.0
    switch_cost_s: float = 10.0
    tick_s: float = 30.0
    max_staleness: int = 1
    core_cells: int = 1
    batch_rule: str = "exact"
    stale_rollouts: str = "drop"
    stale_weight: float = 0.5
    timeout_factor: float = 3.0
    streaming_accumulation: bool = False
    join_cost_s: float | None = None
    durations_s: tuple[float, ...] | None = None
    train_step_serial_s: float = 0.0

    def __post_init__(self) -> None:
        positive = {
            "cells": self.cells,
            "slots_per_cell": self.slots_per_cell,
            "batch_size": self.batch_size,
            "steps": self.steps,
            "rollout_p50_s": self.rollout_p50_s,
            "tick_s": self.tick_s,
            "train_cell_s_per_step": self.train_cell_s_per_step,
        }
        bad = {k: v for k, v in positive.items() if not (isinstance(v, int | float) and math.isfinite(v) and v > 0)}
        if bad:
            raise ValueError(f"Workload: these must be finite and > 0: {bad}")
        if not (math.isfinite(self.tail_ratio) and self.tail_ratio >= 1.0):
            raise ValueError(f"Workload.tail_ratio is p99/p50 and must be ≥ 1, got {self.tail_ratio}")
        if not (math.isfinite(self.switch_cost_s) and self.switch_cost_s >= 0):
            raise ValueError(f"Workload.switch_cost_s must be ≥ 0, got {self.switch_cost_s}")
        if not (math.isfinite(self.train_step_serial_s) and self.train_step_serial_s >= 0):
            raise ValueError(f"Workload.train_step_serial_s must be finite seconds ≥ 0, got {self.train_step_serial_s}")
        if self.max_staleness < 0:
            raise ValueError(f"Workload.max_staleness must be ≥ 0, got {self.max_staleness}")
        if not 0 <= self.core_cells < self.cells:
            raise ValueError(f"Workload.core_cells must be in [0, cells − 1 = {self.cells - 1}], got {self.core_cells}")
        if self.join_cost_s is not None and not (math.isfinite(self.join_cost_s) and self.join_cost_s >= 0):
            raise ValueError(f"Workload.join_cost_s must be ≥ 0 or None (= switch_cost_s), got {self.join_cost_s}")
        if self.durations_s is not None:
            object.__setattr__(self, "durations_s", tuple(self.durations_s))  # a JSON list reads back as a tuple
            bad_d = [d for d in self.durations_s if not (isinstance(d, int | float) and math.isfinite(d) and d > 0)]
            if not self.durations_s or bad_d:
                raise ValueError(f"Workload.durations_s must be a non-empty tuple of finite seconds > 0 (or None), "
                                 f"got {len(self.durations_s)} values, these bad: {bad_d[:5]}")
        if self.batch_rule not in BATCH_RULES:
            raise ValueError(f"Workload.batch_rule must be one of {BATCH_RULES}, got {self.batch_rule!r}")
        if self.stale_rollouts not in STALE_RULES:
            raise ValueError(f"Workload.stale_rollouts must be one of {STALE_RULES}, got {self.stale_rollouts!r}")
        if not (self.timeout_factor > 0 and not math.isnan(self.timeout_factor)):
            raise ValueError(f"Workload.timeout_factor must be > 0 (inf: no timeout), got {self.timeout_factor}")
        if not (math.isfinite(self.stale_weight) and 0.0 <= self.stale_weight <= 1.0):
            raise ValueError(f"Workload.stale_weight must be in [0, 1], got {self.stale_weight}")

    @property
    def sigma(self) -> float:
        return math.log(self.tail_ratio) / Z99

    @property
    def rollout_timeout_s(self) -> float:
        """Seconds of running time after which a rollout is cut and partial-scored (inf: never)."""
        return self.timeout_factor * self.rollout_p50_s

    def switch_cost_to(self, role: str) -> float:
        """Seconds a move into ``role`` takes (``join_cost_s`` into training, ``switch_cost_s`` otherwise)."""
        if role == "train" and self.join_cost_s is not None:
            return self.join_cost_s
        return self.switch_cost_s

    @property
    def rollouts(self) -> int:
        """Rollouts the run needs: one batch per step."""
        return self.steps * self.batch_size

    def durations(self, seed: int, count: int | None = None) -> np.ndarray:
        """``(count,)`` float64 seconds (default ``rollouts``); rollout i gets durations[i] under every policy
        and every ``count`` (common random numbers: a longer draw extends a shorter one); ``durations_s``
        replayed when given."""
        n = self.rollouts if count is None else count
        if self.durations_s is not None:
            return np.resize(np.asarray(self.durations_s, dtype=np.float64), n)
        rng = np.random.default_rng(seed)
        if self.sigma == 0.0:
            return np.full(n, self.rollout_p50_s)
        return self.rollout_p50_s * np.exp(self.sigma * rng.standard_normal(n))

    def with_(self, **changes: object) -> Workload:
        return replace(self, **changes)  # type: ignore[arg-type]

    def to_json(self) -> dict[str, object]:
        return asdict(self)


#: bytes of training state per parameter: bf16 weights (2) + bf16 gradients (2) + fp32 master weights (4) +
#: fp32 Adam moments (8), the usual mixed-precision layout.
TRAIN_BYTES_PER_PARAM = 16.0


def core_cells_for_memory(
    params: float,
    cell_memory_gib: float,
    bytes_per_param: float = TRAIN_BYTES_PER_PARAM,
    usable_fraction: float = 0.8,
) -> int:
    """Core cells needed to hold the authoritative training state: ⌈params × bytes_per_param /
    (cell_memory_gib GiB × usable_fraction)⌉, at least 1 (``usable_fraction``: what is left after
    activations). E.g. 32e9 parameters on 640 GiB cells (8 × 80 GiB): 512 GB in 512 GiB usable → 1 cell;
    72e9 → 3 cells."""
    args = {"params": params, "cell_memory_gib": cell_memory_gib, "bytes_per_param": bytes_per_param}
    bad = {k: v for k, v in args.items() if not (math.isfinite(v) and v > 0)}
    if bad:
        raise ValueError(f"core_cells_for_memory: these must be finite and > 0: {bad}")
    if not (math.isfinite(usable_fraction) and 0.0 < usable_fraction <= 1.0):
        raise ValueError(f"core_cells_for_memory: usable_fraction must be in (0, 1], got {usable_fraction}")
    need = params * bytes_per_param
    per_cell = cell_memory_gib * 2.0**30 * usable_fraction
    return max(1, math.ceil(need / per_cell))


BATCH_RULES = ("exact", "first_finished")
STALE_RULES = ("drop", "discount")

HOUR = 3600.0

#: ``paper``, derived from QwenGyre (SPEC §5 and the seed article); every choice not in the source is marked ASSUMED.
#: * steps = 48 (source: "48 步训练").
#: * tokens_per_rollout = 700_000 (source: "一次 rollout 吃掉约 70 万 token").
#: * rollout_p50_s = 1 h, tail_ratio = 4: source says rollouts last hours, some converge in half an hour while
#:   others run several hours ("半小时收敛 … 跑几个小时"), completion times differ by several times ("差出数倍").
#:   ASSUMED: median 1 h and p99 = 4 h (p1 ≈ 15 min).
#: * cells = 16, slots_per_cell = 4, batch_size = 64: the source states neither cell count nor batch size.
#:   ASSUMED: one batch fills the cluster exactly once (64 rollouts of ~700K context, 4 per cell by KV-cache
#:   memory), a GRPO-like 8 prompts × 8 samples batch.
#: * train_cell_s_per_step = 16 cells × 0.5 h: ASSUMED: training one batch (64 × 700K tokens) on the whole cluster
#:   takes half the median rollout. The source gives no per-step training time; the sweep varies this ratio.
#: * switch_cost_s = 10 s: source: a switch takes "数秒" (seconds). Colocate pays the same cost per phase flip.
#: * max_staleness = 1: ASSUMED for Async and Elastic (one version off-policy, the usual bounded-async setting).
#: * core_cells = 2: ASSUMED two of 16 cells hold the parameters and the optimizer state (set by memory,
#:   ``core_cells_for_memory``: e.g. 60e9 parameters on 640 GiB cells need 2; pinned
#:   to training); the other 14 are satellites. The bench sweeps it to 8.
PAPER = Workload(
    cells=16,
    slots_per_cell=4,
    batch_size=64,
    steps=48,
    rollout_p50_s=1.0 * HOUR,
    tail_ratio=4.0,
    tokens_per_rollout=700_000,
    train_cell_s_per_step=16 * 0.5 * HOUR,
    switch_cost_s=10.0,
    tick_s=60.0,
    max_staleness=1,
    core_cells=2,
)

#: ``paper-fit``: the paper preset with the rollout median, tail and training cost fitted (``simulator/fit.py``,
#: 12 steps, seed 0, Async split a knob too) to the per-step times the source implies (2.80 h Async, 2.91 h
#: Colocate, 1.57 h Elastic). Fit: median 0.88 h, p99/p50 = 3.13, one step = 0.358 median rollouts on the
#: whole cluster; Async at 14 rollout / 2 train cells (PAPER_FIT_ASYNC_ROLLOUT_CELLS). Error: Async +0.2 %,
#: Colocate −5.3 %, Elastic +9.7 % (rms log error 0.062); with Async held at half/half the best fit errs
#: −18 % (Async) and +13 % (Elastic). Reaching the source's Async time needs a training-starved split.
PAPER_FIT = PAPER.with_(rollout_p50_s=3165.0, tail_ratio=3.1346, train_cell_s_per_step=0.3578 * 3165.0 * 16)
PAPER_FIT_ASYNC_ROLLOUT_CELLS = 14

#: ``small``: a fast CI-sized workload (8 cells, 8 steps, 10-minute median rollouts, p99/p50 = 4).
SMALL = Workload()

PRESETS: dict[str, Workload] = {"paper": PAPER, "paper-fit": PAPER_FIT, "small": SMALL}


def preset(name: str) -> Workload:
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown workload preset {name!r}; expected one of {sorted(PRESETS)}") from None
