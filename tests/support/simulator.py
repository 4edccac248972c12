"""Run the simulator with hand-set rollout durations."""

from __future__ import annotations

import numpy as np

from sapwood.scheduler.simulator.cluster import ClusterSim, make_policy
from sapwood.scheduler.simulator.results import SimResult
from sapwood.scheduler.simulator.workload import Workload


def run_with_durations(w: Workload, durations: list[float], policy: str = "async") -> SimResult:
    """``policy`` on ``w`` with the first rollouts' durations (seconds) set by hand; the rest last 1 s."""
    sim = ClusterSim(w, make_policy(policy, w), seed=0)
    sim.durations = np.ones(sim.pool)
    sim.durations[: len(durations)] = durations
    return sim.run()
