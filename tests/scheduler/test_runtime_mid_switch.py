"""``runtime.mid_switch``: the live-loop process driving a switch is SIGKILLed after the leaving cell's calls
were aborted and before they were rerouted. The restarted process first rolls the half-done switch back
(:meth:`SwitchCoordinator.repair`: the held calls rerouted, the cell in ``rollout`` again), then acts on its
own decision: the same move, or keeping the cell. Either way every execution ends with each of its calls
stored once (local Ray, detached runtime actors, SQLite store). The round and its checks are the chaos
campaign's (:mod:`sapwood.demo.chaos.mid_switch`)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from sapwood.demo.chaos.mid_switch import run_round  # noqa: E402
from sapwood.scheduler.runtime.cluster import init_ray  # noqa: E402

NAMESPACE = "sapwood-mid-switch"


@pytest.fixture(scope="module", autouse=True)
def local_ray() -> Iterator[None]:
    init_ray(num_cpus=2, namespace=NAMESPACE)
    yield
    ray.shutdown()


# Each wait of a round is bounded (mid_switch.WAIT_S); this module's pytest timeout stays above their sum, so a
# slow run fails with the message of the wait that ran out, not pytest's.
pytestmark = pytest.mark.timeout(3000)


def test_a_switch_killed_mid_way_is_rolled_back_then_redone_losing_and_duplicating_no_call(tmp_path: Path) -> None:
    r = run_round(tmp_path, "train", tag="mid")
    assert r.held_calls >= 1
    assert "weight_load" not in r.move_phases  # no core cell to take parameters from: nothing loaded
    assert r.rerouted_calls >= r.held_calls
    assert r.stored_rerouted_calls >= r.held_calls


def test_a_restart_deciding_otherwise_rolls_the_half_done_switch_back_and_the_cell_serves_again(
        tmp_path: Path) -> None:
    r = run_round(tmp_path, "rollout", tag="back")
    assert r.held_calls >= 1
    assert r.move_phases == ()  # no move was made
    assert r.rerouted_calls >= r.held_calls
    assert r.stored_rerouted_calls >= r.held_calls
