"""The real vLLM server for gateway tests (``scripts/services.py start vllm`` exports its URL and model folder).

``scripts/test`` starts it whenever the selected tests include ``vllm``-marked ones; without it (a plain
``pytest`` run) those tests skip with a ``no server:`` reason, or fail under ``CI``.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

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
