"""The garbage collector's settings of a serving worker (``SAPWOOD_API_GC_*``).

A worker's heap after start-up (FastAPI, pydantic, SQLAlchemy, the routes' state) is hundreds of
thousands of long-lived objects that every full collection walks again; measured under load
(``bench/profile_api_load.py --timings``) one such pass paused a worker for hundreds of ms, which
every request in flight on it waited out. :func:`apply` moves them out of the collector's sight
(``gc.freeze()``) once the app is built, and sets the youngest generation's threshold: requests
allocate many short-lived containers, and each gen-0 pass is a pause of every thread.
"""

from __future__ import annotations

import gc


def apply(*, freeze: bool, gen0_threshold: int) -> None:
    """Collect once, then freeze what survived (when ``freeze``); set the gen-0 threshold (0 = leave it)."""
    if gen0_threshold > 0:
        _, gen1, gen2 = gc.get_threshold()
        gc.set_threshold(gen0_threshold, gen1, gen2)
    if freeze:
        gc.collect()
        gc.freeze()
