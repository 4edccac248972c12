"""Memo of simulation runs, reusing a run only where the model makes the result provably the same.

A run is deterministic in (workload, policy, seed, policy arguments). Two more identities hold:

* a run in which the policy moved **no cell** never read ``switch_cost_s`` or ``join_cost_s`` (they only
  time switches, and the policies see measured switch costs only), so it is the run under any switch or
  join cost: such a run is also stored under the workload with both costs neutralised, and a later lookup
  there reuses it (Async at a static split never moves a cell);
* a policy that cannot stream (``can_stream = False``, Colocate) runs the same with and without
  ``streaming_accumulation``.
"""

from __future__ import annotations

from sapwood.scheduler.simulator.cluster import ClusterSim, make_policy
from sapwood.scheduler.simulator.results import SimResult
from sapwood.scheduler.simulator.workload import Workload

Key = tuple[Workload, str, int, tuple[tuple[str, object], ...]]


class SimCache:
    """``simulate`` for built-in policy names, memoised. ``runs``: simulations actually run; ``hits``: reused."""

    def __init__(self) -> None:
        self._runs: dict[Key, SimResult] = {}
        self.runs = 0
        self.hits = 0

    @staticmethod
    def _no_switch_key(workload: Workload, policy: str, seed: int, args: tuple[tuple[str, object], ...]) -> Key:
        return (workload.with_(switch_cost_s=0.0, join_cost_s=None), policy, seed, args)

    def simulate(self, workload: Workload, policy: str, seed: int = 0, **policy_kwargs: object) -> SimResult:
        pol = make_policy(policy, workload, **policy_kwargs)
        if not getattr(pol, "can_stream", True):
            workload = workload.with_(streaming_accumulation=False)
        args = tuple(sorted(policy_kwargs.items()))
        exact: Key = (workload, policy, seed, args)
        loose = self._no_switch_key(workload, policy, seed, args)
        for key in (exact, loose):
            if key in self._runs:
                self.hits += 1
                return self._runs[key]
        result = ClusterSim(workload, pol, seed).run()
        self.runs += 1
        self._runs[exact] = result
        if not result.moves:  # no move, so no switch started (a switch still under way at the end counts)
            self._runs[loose] = result
        return result
