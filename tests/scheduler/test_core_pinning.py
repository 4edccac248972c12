"""Cells pinned to cores of their own where there are enough: the plan at its boundary, every thread of a
pinned process moved, and a runtime whose cell reports the core it runs on."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from sapwood.scheduler.runtime.core_pinning import core_plan, usable_cores

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_a_plan_needs_one_core_per_cell_and_one_to_spare() -> None:
    assert core_plan(3, {0, 1, 2}) is None  # exactly as many cores as cells: nothing left for the driver
    assert core_plan(3, {0, 1, 2, 3}) == [1, 2, 3]
    assert core_plan(2, {7, 0, 5, 2}) == [5, 7]  # the highest cores, whatever their numbers
    assert core_plan(1, {4}) is None
    assert core_plan(1, {3, 4}) == [4]
    with pytest.raises(ValueError, match="≥ 1 cell"):
        core_plan(0, {0, 1})


PIN_SCRIPT = """
import json, os, threading
from sapwood.scheduler.runtime.core_pinning import pin_process
stop = threading.Event()
started = threading.Thread(target=stop.wait, daemon=True)
started.start()  # a thread that exists before the pin
core = max(os.sched_getaffinity(0))
pin_process(core)
later = threading.Thread(target=stop.wait, daemon=True)
later.start()  # a thread started after it
tids = os.listdir("/proc/self/task")
print(json.dumps({"core": core, "threads": {t: sorted(os.sched_getaffinity(int(t))) for t in tids}}))
stop.set()
"""


@pytest.mark.skipif(len(usable_cores()) < 2, reason="pinning is visible only with ≥ 2 usable cores")
def test_pinning_moves_every_thread_of_the_process() -> None:
    out = subprocess.run([sys.executable, "-c", PIN_SCRIPT], cwd=REPO_ROOT, check=True, capture_output=True,
                         text=True).stdout
    got = json.loads(out)
    assert len(got["threads"]) >= 3  # the main thread and both others
    assert all(cores == [got["core"]] for cores in got["threads"].values()), got


def test_a_core_the_process_may_not_use_is_refused() -> None:
    from sapwood.scheduler.runtime.core_pinning import pin_process

    with pytest.raises(ValueError, match="not one this process may use"):
        pin_process(max(usable_cores()) + 1)


@pytest.mark.skipif(len(usable_cores()) < 2, reason="a one-cell plan needs 2 usable cores")
def test_a_runtime_with_enough_cores_pins_its_cell(tmp_path: Path) -> None:
    ray = pytest.importorskip("ray")
    from sapwood.scheduler.runtime.cluster import CellSpec, ElasticRuntime, init_ray
    from tests.support.elastic_runtime import initial_state, model_config

    init_ray(num_cpus=2)
    try:
        rt = ElasticRuntime(f"sqlite:///{tmp_path / 'store.db'}", [CellSpec("c0")], model_config(), initial_state(),
                            pin_cores=True)
        try:
            assert rt.core_pins == {"c0": max(usable_cores())}
            assert ray.get(rt.cells["c0"].status.remote())["core"] == max(usable_cores())
        finally:
            rt.shutdown()
    finally:
        ray.shutdown()
