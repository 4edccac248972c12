"""The elastic policy's decision, one named step at a time (``ElasticPolicy.decide`` runs them in order)."""

from __future__ import annotations

from sapwood.platform.events.cells import CellRole
from sapwood.scheduler.policies import ElasticPolicy
from sapwood.scheduler.policies.elastic import Tick
from sapwood.scheduler.signals import CellState, Signals

CAP, BATCH = 4, 32


def tick(policy: ElasticPolicy, roles: list[CellRole], *, tiers: list[str] | None = None, **signals: object) -> Tick:
    """A tick at t = 1000 s over cells c0… in ``roles``, each in its role since t = 0 (dwell passed)."""
    tiers = tiers or ["satellite"] * len(roles)
    cells = tuple(CellState(f"c{i}", tiers[i], CAP, r, 0.0, 1000.0) for i, r in enumerate(roles))  # type: ignore[arg-type]
    s = Signals(at_s=1000.0, cells=cells, batch_size=BATCH, **signals)  # type: ignore[arg-type]
    return Tick.start(policy, s, {c.cell_id: c.role for c in cells})


def test_feed_starved_roles_gives_waiting_training_work_one_cell_and_no_more() -> None:
    t = tick(ElasticPolicy(), ["rollout"] * 4, train_active=True, rollout_demand=4, in_flight=4)
    ElasticPolicy().feed_starved_roles(t)
    assert t.count("train") == 1
    assert t.moves == 1
    assert next(iter(t.reasons.values())).startswith("starved: training work waiting")


def test_feed_starved_roles_gives_waiting_rollouts_one_cell_unless_a_stale_batch_waits() -> None:
    p = ElasticPolicy(min_train_cells=0)
    t = tick(p, ["train"] * 3, rollout_demand=5)
    p.feed_starved_roles(t)
    assert t.count("rollout") == 1
    stale = tick(p, ["train"] * 3, rollout_demand=5, backlog_executions=BATCH, staleness_max=2)
    assert stale.stale
    p.feed_starved_roles(stale)
    assert stale.count("rollout") == 0, "a full batch past the staleness bound: train it first"


def test_rollout_target_is_the_demand_with_hysteresis_in_cells_at_the_boundary() -> None:
    p = ElasticPolicy(hysteresis_slots=1)
    # 7 rollouts + 1 slot of slack = 8 slots = exactly 2 cells of 4; one more rollout needs a third
    assert p.rollout_target(tick(p, ["rollout"] * 6, rollout_demand=7)) == 2
    assert p.rollout_target(tick(p, ["rollout"] * 6, rollout_demand=8)) == 3
    assert p.rollout_target(tick(p, ["rollout"] * 6, rollout_demand=0)) == 0
    assert p.rollout_target(tick(p, ["rollout"] * 6, rollout_demand=0, in_flight=3)) == 1, (
        "executions between two calls hold no slot but keep one rollout cell")
    assert p.rollout_target(tick(p, ["rollout"] * 6, rollout_demand=0, in_flight=3, backlog_executions=BATCH)) == 1
    assert p.rollout_target(tick(p, ["rollout"] * 6, rollout_demand=1000)) == 6, "capped by the live cells"


def test_rollout_target_keeps_min_train_cells_and_freezes_growth_when_stale() -> None:
    p = ElasticPolicy(min_train_cells=2)
    busy = {"rollout_demand": 1000, "train_active": True, "rollout_p50_s": 1.0, "train_step_cell_s": 1e-9}
    assert p.rollout_target(tick(p, ["rollout"] * 6, **busy)) == 4, "n − min_train_cells"
    stale = tick(p, ["rollout", "train", "train", "train"], rollout_demand=1000, backlog_executions=BATCH,
                 staleness_max=2)
    assert p.rollout_target(stale) == 1, "stale: no more rollout cells than now"


def test_grow_rollout_moves_only_what_the_gate_pays_for() -> None:
    cheap, dear = ElasticPolicy(switch_cost_prior_s=1.0), ElasticPolicy(switch_cost_prior_s=1e6)
    signals = {"rollout_demand": 12, "rollout_p50_s": 600.0}
    t = tick(cheap, ["rollout", "idle", "idle", "idle"], **signals)
    cheap.grow_rollout(t, 3)
    assert t.count("rollout") == 3, "stops at the target"
    t = tick(dear, ["rollout", "idle", "idle", "idle"], **signals)
    dear.grow_rollout(t, 3)
    assert t.moves == 0, "saving 600 s does not pay a 2e6 s round trip"


def test_shrink_rollout_releases_surplus_capacity_down_to_the_target() -> None:
    p = ElasticPolicy(switch_cost_prior_s=1.0, hysteresis_slots=1)
    signals = {"rollout_demand": 3, "train_active": True, "train_remaining_cell_s": 3600.0,
               "train_step_cell_s": 3600.0}
    t = tick(p, ["rollout"] * 4 + ["train"], **signals)
    p.shrink_rollout(t, 1)
    assert t.count("rollout") == 1
    assert all(r.startswith("surplus") for r in t.reasons.values())


def test_a_pinned_core_cell_is_never_eligible_to_leave_training() -> None:
    p = ElasticPolicy(pin_core=True, min_train_cells=0)
    t = tick(p, ["train", "train"], tiers=["core", "satellite"], rollout_demand=8, rollout_p50_s=600.0)
    assert [c.cell_id for c in t.eligible("train", "satellite")] == ["c1"]
