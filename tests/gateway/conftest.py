"""The real vLLM server for gateway tests (``scripts/services.py start vllm`` exports its URL)."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="session")
def vllm_url() -> str:
    """Base URL of the running vLLM CPU server serving the tiny model as ``tiny``."""
    url = os.environ.get("SAPWOOD_TEST_VLLM_URL")
    if not url:
        pytest.skip("no server: SAPWOOD_TEST_VLLM_URL is unset (run `python scripts/services.py start vllm`)")
    return url.rstrip("/")
