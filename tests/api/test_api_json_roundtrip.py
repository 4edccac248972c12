"""JSON values round-trip on both stores: what a write path accepts, every read path returns equal.

Write paths: ``POST /v1/runs`` (config), ``POST /v1/executions/{id}/scores`` (score, components) and
events applied to the store (what ingest and the recorder SDK apply after decoding: an execution's
``sampling_params`` and ``metadata``, a call's ``timings`` and ``sampling_params``). Read paths: the
run, the run listing, the execution, its listing, scores, tree, tree summary, call audit and listing.
Numbers a double does not hold exactly, NaN and Infinity are refused with a 422 naming the field.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sapwood.platform.errors import ValidationError
from sapwood.platform.json_values import EXACT_INT_MAX, check_json_numbers, load_json
from sapwood.platform.store import Store
from sapwood.platform.writer import ExecutionWriter
from tests.support.api_client import Keys, TestClient, make_client, make_keys

#: Numbers a double holds exactly: floats (finite, the extremes included), integers within ±2**53
#: and larger integers that are doubles (``10**20``), which PostgreSQL's JSONB prints as integers.
numbers = st.one_of(
    st.floats(allow_nan=False, allow_infinity=False),
    st.integers(-EXACT_INT_MAX, EXACT_INT_MAX),
    st.floats(min_value=2.0**53, max_value=sys.float_info.max).map(lambda f: int(f)),
    st.sampled_from([0.0, -0.0, 1e20, -1e20, 1.5e300, sys.float_info.max, -sys.float_info.max,
                     sys.float_info.min, 5e-324, 2**53, -(2**53), 10**20]),
)
text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=12)
json_values = st.recursive(st.none() | st.booleans() | numbers | text,
                           lambda inner: st.lists(inner, max_size=4) | st.dictionaries(text, inner, max_size=4),
                           max_leaves=12)
json_objects = st.dictionaries(text, json_values, max_size=5)
number_maps = st.dictionaries(st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
                                      min_size=1, max_size=12), numbers, max_size=5)


def same(a: Any, b: Any) -> bool:
    """Equal as JSON values: numbers by value (a stored float may read back as an equal integer)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


@pytest.fixture(params=["postgresql", "sqlite"])
def any_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    url = request.getfixturevalue("pg_url") if request.param == "postgresql" else f"sqlite:///{tmp_path / 'j.db'}"
    store = Store.open(url)
    yield store
    store.close()


@pytest.fixture
def served(any_store: Store) -> Iterator[tuple[Store, TestClient, Keys]]:
    keys = make_keys(any_store)
    with make_client(any_store, api_cache_bytes=0) as client:
        yield any_store, client, keys


def _execution(store: Store, sampling: dict[str, Any], metadata: dict[str, Any], timings: dict[str, Any],
               call_sampling: dict[str, Any]) -> tuple[str, str]:
    w = ExecutionWriter(run_id="json-rt", task_id="t", sampling_params=sampling, metadata=metadata)
    w.start()
    call = w.call(None, np.arange(1, 6), np.arange(6, 9), np.full(3, -0.5), timings=timings,
                  sampling_params=call_sampling)
    w.finish("success", reward=1.0)
    store.apply(w.events)
    return w.execution_id, call.event_id


def _ok(client: TestClient, keys: Keys, url: str) -> Any:
    response = client.get(url, headers=keys.headers("read"))
    assert response.status_code == 200, (url, response.status_code, response.text[:500])
    return response.json()


def _listed(client: TestClient, keys: Keys, url: str, id_field: str, wanted: str) -> Any:
    """The item ``wanted`` of a paginated listing (every page walked)."""
    page = _ok(client, keys, url)
    while True:
        for item in page["items"]:
            if item[id_field] == wanted:
                return item
        assert page["next_cursor"], f"{wanted} not listed by {url}"
        page = _ok(client, keys, url + ("&" if "?" in url else "?") + f"cursor={page['next_cursor']}")


EXAMPLES = settings(max_examples=12, deadline=None, derandomize=True, database=None,
                    suppress_health_check=list(HealthCheck))


@given(config=json_objects)
@EXAMPLES
def _run_config_case(served: tuple[Store, TestClient, Keys], config: dict[str, Any]) -> None:
    _, client, keys = served
    response = client.post("/v1/runs", headers=keys.headers("write"), json={"config": config})
    assert response.status_code == 201, response.text[:500]
    run_id = response.json()["run_id"]
    assert same(response.json()["config"], config)
    assert same(_ok(client, keys, f"/v1/runs/{run_id}")["config"], config)
    assert same(_listed(client, keys, "/v1/runs", "run_id", run_id)["config"], config)


def test_run_configs_round_trip(served: tuple[Store, TestClient, Keys]) -> None:
    _run_config_case(served)


@given(sampling=json_objects, metadata=json_objects, timings=number_maps, call_sampling=json_objects,
       score=numbers, components=number_maps)
@EXAMPLES
def _execution_case(served: tuple[Store, TestClient, Keys], sampling: dict[str, Any], metadata: dict[str, Any],
                    timings: dict[str, Any], call_sampling: dict[str, Any], score: Any,
                    components: dict[str, Any]) -> None:
    store, client, keys = served
    eid, call_id = _execution(store, sampling, metadata, timings, call_sampling)
    response = client.post(f"/v1/executions/{eid}/scores", headers=keys.headers("write"),
                           json={"score": score, "components": components})
    assert response.status_code == 201, response.text[:500]
    execution = _ok(client, keys, f"/v1/executions/{eid}")
    assert same(execution["sampling_params"], sampling)
    assert same(execution["metadata"], metadata)
    assert same(execution["score"], score)
    listed = _listed(client, keys, "/v1/executions?run_id=json-rt", "execution_id", eid)
    assert same(listed["metadata"], metadata)
    (stored,) = _ok(client, keys, f"/v1/executions/{eid}/scores")
    assert same(stored["components"], components)
    assert same(stored["score"], score)
    for view in ("tree", "tree/summary", "trajectories"):
        _ok(client, keys, f"/v1/executions/{eid}/{view}")
    audit = _ok(client, keys, f"/v1/calls/{call_id}/audit")
    assert same(audit["timings"], timings)
    assert same(audit["sampling_params"], call_sampling or sampling)
    _ok(client, keys, f"/v1/executions/{eid}/calls")


def test_execution_values_and_scores_round_trip(served: tuple[Store, TestClient, Keys]) -> None:
    _execution_case(served)


@pytest.mark.parametrize(("body", "field"), [
    pytest.param('{"score": 0.5, "components": {"a": 123456789012345678}}', "body.components.a", id="inexact int"),
    pytest.param('{"score": 1e400}', "body.score", id="1e400"),
    pytest.param('{"score": NaN}', "body", id="NaN"),
    pytest.param('{"score": 0.5, "components": {"a": Infinity}}', "body", id="Infinity"),
])
def test_numbers_a_double_does_not_hold_get_422_naming_the_field(served: tuple[Store, TestClient, Keys],
                                                                  body: str, field: str) -> None:
    store, client, keys = served
    eid, _ = _execution(store, {}, {}, {}, {})
    response = client.post(f"/v1/executions/{eid}/scores", headers={**keys.headers("write"),
                           "Content-Type": "application/json"}, content=body.encode())
    assert response.status_code == 422, response.text[:500]
    assert field in response.text
    assert client.get(f"/v1/executions/{eid}/scores", headers=keys.headers("read")).json() == []


def test_a_run_config_with_an_inexact_integer_is_refused_naming_its_path(
        served: tuple[Store, TestClient, Keys]) -> None:
    _, client, keys = served
    response = client.post("/v1/runs", headers={**keys.headers("write"), "Content-Type": "application/json"},
                           content=b'{"config": {"opt": {"lr": [1, 9007199254740993]}}}')
    assert response.status_code == 422, response.text[:500]
    assert "config.opt.lr[1]" in response.text


@pytest.mark.parametrize(("field", "value"), [("timings", {"ttft": math.inf}),
                                              ("sampling_params", {"seed": 2**53 + 1}),
                                              ("sampling_params", {"x": [float("nan")]})])
def test_events_with_numbers_a_double_does_not_hold_are_refused(field: str, value: dict[str, Any]) -> None:
    w = ExecutionWriter(run_id="r", task_id="t", validate=False)
    w.start()
    call = w.call(None, np.arange(1, 4), np.arange(4, 6), np.zeros(2), **{field: value})  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match=f"model_call.{field}"):
        call.validate()
    call.__dict__[field] = {"ok": 1.5}
    call.validate()


def test_the_reader_returns_integers_beyond_64_bits_as_the_doubles_they_were() -> None:
    assert load_json("[100000000000000000000, 37359983899994740, 9007199254740992, 1e20]") == [
        1e20, 3.735998389999474e16, 2**53, 1e20]
    assert isinstance(load_json("100000000000000000000"), float)
    assert isinstance(load_json("9007199254740992"), int)
    check_json_numbers({"a": [10**20, 2**53, -(2**53), 5e-324]}, "x")
    with pytest.raises(ValidationError, match=r"x\.a\[0\]"):
        check_json_numbers({"a": [2**53 + 1]}, "x")
