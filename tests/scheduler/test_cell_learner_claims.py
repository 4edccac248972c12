"""The learner group's claims (``runtime/cell_learner.py``) over a real ``TCPStore``: a micro-batch released
to the redo queue is taken by exactly one member, before the step's claim counter."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from datetime import timedelta

import pytest
import torch.distributed as dist

from sapwood.scheduler.runtime.cell_learner import GroupMember, GroupSpec
from sapwood.scheduler.runtime.device_clock import DeviceClock, DeviceCosts
from tests.support.megatron_ranks import model_config


def _member(store: dist.TCPStore, port: int, rank: int) -> GroupMember:
    m = GroupMember(GroupSpec(port, rank, 3), model_config(), DeviceClock(), DeviceCosts, lambda: "train")
    m.store = store
    return m


@pytest.fixture
def members() -> Iterator[list[GroupMember]]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    store = dist.TCPStore("127.0.0.1", port, 1, is_master=True, timeout=timedelta(seconds=30))
    yield [_member(store, port, r) for r in range(3)]


def test_a_released_micro_batch_is_taken_once_and_before_the_counter(members: list[GroupMember]) -> None:
    core, first, second = members
    assert first._claim(7) == 0, "no release yet: the counter's first index"
    core._publish_redo(7, 3)
    assert second._claim(7) == 3, "the released micro-batch comes before the counter"
    assert first._claim(7) == 1, "taken once: the next claimer gets the counter again"
    assert first._claim(7, counter=False) is None, "nothing open on the queue and the counter not asked"
    core._publish_redo(7, 2)
    core._publish_redo(8, 0)  # another step's release is not this step's
    assert first._claim(7, counter=False) == 2
    assert second._claim(7, counter=False) is None


def test_an_entry_published_but_not_yet_opened_is_skipped(members: list[GroupMember]) -> None:
    """The queue's length grows before the entry is written (``_publish_redo``'s order): a claimer that
    sees the length first finds no open entry and takes nothing (``compare_set`` on a missing key)."""
    core, first, _ = members
    core.store.add("redo_n/4", 1)
    assert first._claim(4, counter=False) is None
    core.store.set("redo_index/4/0", "1")
    core.store.set("redo/4/0", "open")
    assert first._claim(4, counter=False) == 1
