"""The serving worker's collector settings (``SAPWOOD_API_GC_FREEZE``, ``SAPWOOD_API_GC_GEN0_THRESHOLD``)."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from sapwood.api import gc_policy
from sapwood.platform.store import Store
from tests.support.api_client import make_client


@pytest.fixture
def restored_gc() -> Iterator[None]:
    threshold = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*threshold)


def test_apply_freezes_the_heap_and_sets_the_youngest_threshold(restored_gc: None) -> None:
    gc.unfreeze()
    gen1, gen2 = gc.get_threshold()[1:]
    gc_policy.apply(freeze=True, gen0_threshold=12_345)
    assert gc.get_threshold() == (12_345, gen1, gen2)
    assert gc.get_freeze_count() > 1000  # the interpreter's, pytest's and the API's modules at least


def test_zero_and_false_leave_the_collector_alone(restored_gc: None) -> None:
    gc.unfreeze()
    before = gc.get_threshold()
    gc_policy.apply(freeze=False, gen0_threshold=0)
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0


def test_the_app_applies_it_at_start_up(pg_store: Store, restored_gc: None) -> None:
    gc.unfreeze()
    with make_client(pg_store, api_gc_gen0_threshold=23_456) as client:
        assert client.get("/healthz").status_code == 200
        assert gc.get_threshold()[0] == 23_456
        assert gc.get_freeze_count() > 1000
