"""What a simulation run reports."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class Switch:
    cell_id: str
    from_role: str
    to_role: str
    start_s: float
    duration_s: float


@dataclass(frozen=True)
class Move:
    at_s: float
    cell_id: str
    from_role: str
    to_role: str
    reason: str


@dataclass
class SimResult:
    """Outcome of one run. Idle fractions are of the cell-seconds spent in each role (rollout: unused slots)."""

    policy: str
    seed: int
    steps: int
    wall_s: float
    idle_fraction: dict[str, float]
    cell_seconds: dict[str, float]
    staleness: list[int]
    switches: list[Switch]
    moves: list[Move]
    decisions: int
    completions: np.ndarray  # (rollouts,) int: how often each rollout completed
    trained: np.ndarray  # (rollouts,) int: how often each rollout was trained on
    #: (t, rollout, train, idle, switching) cell counts at every change
    timeline: list[tuple[float, int, int, int, int]] = field(default_factory=list)
    #: training weight of each consumed rollout, in consumption order (1 unless discounted as stale)
    weights: list[float] = field(default_factory=list)
    #: staleness (versions) of each rollout dropped as too stale where a step consumed it
    dropped: list[int] = field(default_factory=list)
    #: rollout index -> partial score (fraction of its work done) for every rollout cut by the timeout
    timed_out: dict[int, float] = field(default_factory=dict)
    #: cell id -> seconds spent in each role ("rollout", "train", "idle") and switching
    role_cell_s: dict[str, dict[str, float]] = field(default_factory=dict)
    #: the core cells pinned to training
    pinned: list[str] = field(default_factory=list)
    #: policy moves of a pinned cell out of training that the simulator refused
    refused_moves: int = 0

    @property
    def switch_count(self) -> int:
        return len(self.switches)

    @property
    def switch_cell_s(self) -> float:
        return float(sum(s.duration_s for s in self.switches))

    def staleness_histogram(self) -> dict[str, int]:
        values, counts = np.unique(np.asarray(self.staleness, dtype=np.int64), return_counts=True)
        return {str(int(v)): int(c) for v, c in zip(values, counts, strict=True)}

    def summary(self) -> dict[str, object]:
        """JSON-ready figures (hours where the unit says so)."""
        st = np.asarray(self.staleness, dtype=np.float64)
        return {
            "policy": self.policy,
            "seed": self.seed,
            "steps": self.steps,
            "wall_h": round(self.wall_s / 3600.0, 4),
            "idle_rollout": round(self.idle_fraction["rollout"], 4),
            "idle_train": round(self.idle_fraction["train"], 4),
            "switching_fraction": round(self.idle_fraction["switching"], 4),
            "switches": self.switch_count,
            "switch_cell_h": round(self.switch_cell_s / 3600.0, 4),
            "staleness_mean": round(float(st.mean()), 4) if st.size else 0.0,
            "staleness_max": int(st.max()) if st.size else 0,
            "staleness_hist": self.staleness_histogram(),
            "decisions": self.decisions,
            "dropped_stale": len(self.dropped),
            "timed_out": len(self.timed_out),
            "weight_mean": round(float(np.mean(self.weights)), 4) if self.weights else 1.0,
        }
