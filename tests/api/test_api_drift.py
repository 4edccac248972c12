"""``GET /v1/drift`` (the run-level drift table) and ``GET /v1/runs/{run_id}/drift`` on both backends: no call
checked → rate null (never NaN), every call drifted, drift at position 0."""

from __future__ import annotations

from sapwood.platform.events import ModelCall
from sapwood.platform.store import Store
from tests.support.api_client import make_client, make_keys
from tests.support.histories import drift_execution


def test_the_drift_table_and_one_run(any_store: Store) -> None:
    keys = make_keys(any_store)
    every = drift_execution("all", [(True, 0), (True, 6)])
    any_store.apply(every.events)
    any_store.apply(drift_execution("half", [(True, None), (True, 2), (False, None)]).events)
    any_store.apply(drift_execution("sdk", [(False, None)]).events)
    with make_client(any_store) as c:
        table = c.get("/v1/drift", headers=keys.headers("read"))
        assert table.status_code == 200, table.text
        assert table.json() == {"runs": [
            {"run_id": "all", "calls": 2, "checked": 2, "drifted": 2, "rate": 1.0, "first_position": 0},
            {"run_id": "half", "calls": 3, "checked": 2, "drifted": 1, "rate": 0.5, "first_position": 2},
        ]}, "the unchecked run is left out"
        one = c.get("/v1/runs/all/drift", headers=keys.headers("read"), params={"limit": 1}).json()
        calls = [e for e in every.events if isinstance(e, ModelCall)]
        assert one["drifted_calls"] == [{"call_id": calls[0].call_id, "execution_id": every.execution_id,
                                         "seq": calls[0].seq, "position": 0}]
        assert (one["checked"], one["drifted"], one["rate"]) == (2, 2, 1.0)
        sdk = c.get("/v1/runs/sdk/drift", headers=keys.headers("read")).json()
        assert sdk == {"run_id": "sdk", "calls": 1, "checked": 0, "drifted": 0, "rate": None,
                       "first_position": None, "drifted_calls": []}
        missing = c.get("/v1/runs/missing/drift", headers=keys.headers("read")).json()
        assert (missing["calls"], missing["rate"]) == (0, None)
        assert c.get("/v1/drift").status_code == 401, "a read key is needed"
