"""``scripts/services.py`` helpers that need no server."""

from __future__ import annotations

import base64
import itertools
from collections.abc import Iterator

import pytest

from tests.support.services import services_module


def test_cluster_id_is_a_22_character_kraft_id() -> None:
    cluster_id = services_module().new_cluster_id()
    assert len(cluster_id) == 22
    assert len(base64.urlsafe_b64decode(cluster_id + "==")) == 16


def test_cluster_id_never_starts_with_a_dash(monkeypatch: pytest.MonkeyPatch) -> None:
    # 0xF8 encodes to '-' as the first urlsafe-base64 character: the storage tool's argument
    # parser would take such an id for an option. The first draw is rejected, the second kept.
    draws: Iterator[bytes] = itertools.chain([b"\xf8" + bytes(15)], itertools.repeat(b"\x01" * 16))
    module = services_module()
    monkeypatch.setattr(module.os, "urandom", lambda n: next(draws)[:n])
    cluster_id = module.new_cluster_id()
    assert not cluster_id.startswith("-")
    assert base64.urlsafe_b64decode(cluster_id + "==") == b"\x01" * 16
