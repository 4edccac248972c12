"""The real vLLM server for gateway tests (``scripts/services.py start vllm`` exports its URL and model folder),
and an embedded store to record into.

``scripts/test`` starts it whenever the selected tests include ``vllm``-marked ones; without it (a plain
``pytest`` run) those tests skip with a ``no server:`` reason, or fail under ``CI``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from sapwood.platform.storage.dialects import embedded_url
from sapwood.platform.store import Store
from sapwood.rollout.transports import InProcessTransport

NO_VLLM = "no server: {var} is unset (run `python scripts/services.py start vllm` and source .services/env)"


def _env(var: str) -> str:
    value = os.environ.get(var)
    if not value:
        if os.environ.get("CI"):
            pytest.fail(NO_VLLM.format(var=var), pytrace=False)
        pytest.skip(NO_VLLM.format(var=var))
    return value


@pytest.fixture(scope="session")
def vllm_url() -> str:
    """Base URL of the running vLLM CPU server serving the tiny model as ``tiny``."""
    return _env("SAPWOOD_TEST_VLLM_URL").rstrip("/")


@pytest.fixture(scope="session")
def vllm_model_dir() -> Path:
    """The folder ``vllm serve`` was given (config, weights, ``tokenizer.json``)."""
    return Path(_env("SAPWOOD_TEST_VLLM_MODEL_DIR"))


@pytest.fixture
def recording(tmp_path: Path) -> Iterator[tuple[Store, InProcessTransport]]:
    """An embedded store under ``tmp_path`` and a transport that applies each event at once; closed after."""
    store = Store.open(embedded_url(tmp_path / "gw.db"))
    transport = InProcessTransport(store, batch_size=1)
    yield store, transport
    transport.close()
    store.close()
