"""/v1/cells and /v1/scheduler/decisions: read scope, pagination, filters, liveness."""

from __future__ import annotations

import time

from sapwood.platform.events import CellHeartbeat, CellRegistered, RoleAssigned
from sapwood.platform.store import Store
from tests.support.api_client import Keys, TestClient


def load_cells(store: Store) -> float:
    now = time.time()
    events = [CellRegistered(cell_id=f"cell-{i}", tier="core" if i < 2 else "satellite", capacity=4,
                             created_at=now - 100) for i in range(5)]
    events += [CellHeartbeat(cell_id=f"cell-{i}", created_at=now - (1 if i != 3 else 90)) for i in range(5)]
    events += [RoleAssigned(cell_id=f"cell-{i % 5}", role=("train" if i % 2 else "rollout"),
                            previous_role=("rollout" if i % 2 else "train"), reason=f"decision {i}", policy="elastic",
                            signals={"rollout_demand": i}, created_at=now - 50 + i) for i in range(7)]
    store.apply(events)
    return now


def test_cells_listing_with_liveness_and_pages(client: TestClient, keys: Keys, pg_store: Store) -> None:
    load_cells(pg_store)
    r = client.get("/v1/cells", headers=keys.headers("read"), params={"limit": 3})
    assert r.status_code == 200, r.text
    page = r.json()
    assert [c["cell_id"] for c in page["items"]] == ["cell-0", "cell-1", "cell-2"]
    assert page["next_cursor"]
    rest = client.get("/v1/cells", headers=keys.headers("read"), params={"cursor": page["next_cursor"]}).json()
    assert [c["cell_id"] for c in rest["items"]] == ["cell-3", "cell-4"]
    assert rest["next_cursor"] is None
    by_id = {c["cell_id"]: c for c in page["items"] + rest["items"]}
    assert by_id["cell-3"]["lost"]
    assert not by_id["cell-4"]["lost"]
    assert by_id["cell-0"]["tier"] == "core"
    assert by_id["cell-4"]["tier"] == "satellite"
    # cell-1: decision 1 (→ train), decision 6 (→ rollout); cell-2: decision 2 only
    assert by_id["cell-1"]["role"] == "rollout"
    assert by_id["cell-1"]["role_changes"] == 2
    assert by_id["cell-2"]["role"] == "rollout"
    assert by_id["cell-2"]["role_changes"] == 1


def test_decisions_answer_why_a_cell_moved(client: TestClient, keys: Keys, pg_store: Store) -> None:
    now = load_cells(pg_store)
    r = client.get("/v1/scheduler/decisions", headers=keys.headers("read"),
                   params={"cell_id": "cell-1", "role": "train"})
    assert r.status_code == 200, r.text
    (d,) = r.json()["items"]
    assert d["reason"] == "decision 1"
    assert d["signals"] == {"rollout_demand": 1}
    assert d["previous_role"] == "rollout"
    window = client.get("/v1/scheduler/decisions", headers=keys.headers("read"),
                        params={"after": now - 48, "before": now - 45}).json()["items"]
    assert [w["reason"] for w in window] == ["decision 2", "decision 3", "decision 4"]
    seen, cursor = [], None
    while True:
        params: dict[str, object] = {"limit": 2, **({"cursor": cursor} if cursor else {})}
        page = client.get("/v1/scheduler/decisions", headers=keys.headers("read"), params=params).json()
        seen += [i["reason"] for i in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == [f"decision {i}" for i in range(7)]


def test_scheduler_routes_need_a_key_and_valid_params(client: TestClient, keys: Keys) -> None:
    assert client.get("/v1/cells").status_code == 401
    assert client.get("/v1/scheduler/decisions").status_code == 401
    bad = client.get("/v1/scheduler/decisions", headers=keys.headers("read"), params={"role": "dance"})
    assert bad.status_code == 422
    bad_cursor = client.get("/v1/cells", headers=keys.headers("read"), params={"cursor": "abc"})
    assert bad_cursor.status_code == 422
