"""The wire doc, its JSON Schema, the validator and the stored columns agree on every length limit and
minimum array count: all are read against one source, ``sapwood.platform.events.limits``."""

from __future__ import annotations

import json
import re
import struct
from pathlib import Path
from typing import Any

import jsonschema
import numpy as np
import pytest
import sqlalchemy as sa

from sapwood.platform import schema as t
from sapwood.platform.codec import encode
from sapwood.platform.errors import ValidationError
from sapwood.platform.events import EVENT_TYPES
from sapwood.platform.events.limits import ARRAY_MIN_COUNTS, STRING_LENGTHS
from sapwood.platform.writer import ExecutionWriter

ROOT = Path(__file__).resolve().parents[2]
_TEXT = (ROOT / "docs" / "wire-format.md").read_text()
DOC = _TEXT[_TEXT.index("### Event kinds") : _TEXT.index("Numbers must be finite")]  # the kinds table
SCHEMA = json.loads((ROOT / "docs" / "wire-header.schema.json").read_text())
STRINGS = [(k, n, lo, hi) for k, fs in STRING_LENGTHS.items() for n, (lo, hi) in fs.items()]
ARRAYS = [(k, n, fewest) for k, arrs in ARRAY_MIN_COUNTS.items() for n, fewest in arrs.items()]
#: (kind, field) → the column the field is stored in.
COLUMNS = {("execution_started", "run_id"): t.executions.c.run_id,
           ("execution_started", "task_id"): t.executions.c.task_id,
           ("execution_started", "task_family"): t.executions.c.task_family,
           ("execution_started", "engine"): t.executions.c.engine,
           ("model_call", "finish_reason"): t.calls.c.finish_reason,
           ("partial_score", "scorer"): t.scores.c.scorer,
           ("policy_published", "run_id"): t.policy_versions.c.run_id}


def _doc_row(kind: str) -> str:
    rows = [line for line in DOC.splitlines() if line.startswith(f"| `{kind}` |")]
    assert len(rows) == 1, f"one row of the kinds table for {kind}"
    return rows[0]


def _schema_branch(kind: str) -> dict[str, Any]:
    return next(b["then"]["properties"] for b in SCHEMA["allOf"] if b["if"]["properties"]["kind"]["const"] == kind)


@pytest.mark.parametrize(("kind", "name", "low", "high"), STRINGS)
def test_each_string_limit_is_the_same_in_doc_schema_and_column(kind: str, name: str, low: int, high: int) -> None:
    assert f"`{name}` str ({low}–{high} chars" in _doc_row(kind)
    prop = _schema_branch(kind)["fields"]["properties"][name]
    assert (prop.get("minLength", 0), prop["maxLength"]) == (low, high)
    column_type = COLUMNS[(kind, name)].type
    assert isinstance(column_type, sa.String)
    assert column_type.length == high


def test_every_bounded_string_column_of_an_event_field_has_a_limit() -> None:
    assert set(COLUMNS) == {(k, n) for k, n, _, _ in STRINGS}


@pytest.mark.parametrize(("kind", "name", "fewest"), ARRAYS)
def test_each_minimum_array_count_is_the_same_in_doc_and_schema(kind: str, name: str, fewest: int) -> None:
    assert re.search(rf"`{name}` `<[if]4` \(≥ {fewest}\b", _doc_row(kind))
    arrays = _schema_branch(kind)["arrays"]
    item = next(i for i in arrays["items"]["oneOf"] if i["prefixItems"][0]["const"] == name)
    assert item["prefixItems"][2]["minimum"] == fewest
    assert {"contains": {"type": "array", "prefixItems": [{"const": name}]}} in arrays["allOf"], "required"


def test_the_doc_states_no_minimum_the_limits_do_not_hold() -> None:
    stated = {(kind, m.group(1)) for kind in EVENT_TYPES if f"| `{kind}` |" in DOC
              for m in re.finditer(r"`(\w+)` `<[if]4` \(≥ \d+", _doc_row(kind))}
    assert stated == {(k, n) for k, n, _ in ARRAYS}


def header_of(event: Any) -> dict[str, Any]:
    """The JSON header of ``event`` encoded uncompressed (docs/wire-format.md §2)."""
    raw = encode(event)
    size = struct.unpack_from("<I", raw, 6)[0]
    return dict(json.loads(raw[10 : 10 + size]))


def _started(**fields_: Any) -> Any:
    kw = {"run_id": "r", "task_id": "t", **fields_}
    w = ExecutionWriter(run_id=kw.pop("run_id"), task_id=kw.pop("task_id"))
    w.start()
    ev = w.events[0]
    for k, v in kw.items():
        setattr(ev, k, v)
    return ev


@pytest.mark.parametrize(("name", "high"), [(n, hi) for k, n, _, hi in STRINGS if k == "execution_started"
                                             and n != "run_id"])
def test_the_validator_and_the_schema_accept_the_limit_and_refuse_one_more(name: str, high: int) -> None:
    validator = jsonschema.Draft202012Validator(SCHEMA)
    at_limit = _started(**{name: "x" * high})
    at_limit.validate()
    validator.validate(header_of(at_limit))
    over = _started(**{name: "x" * (high + 1)})
    with pytest.raises(ValidationError, match=rf"execution_started\.{name} must be a string of \d+-{high} characters"):
        over.validate()
    assert not validator.is_valid(header_of(over))


@pytest.mark.parametrize(("kind", "name", "fewest"), ARRAYS)
def test_the_validator_refuses_an_array_below_its_minimum(kind: str, name: str, fewest: int) -> None:
    w = ExecutionWriter(run_id="r", task_id="t")
    w.start()
    p = w.prompt(np.arange(4, dtype=np.int32))
    call = w.call(p.node_id, np.arange(2, dtype=np.int32), [5], [-0.1], kind="summary")
    w.compact(call.output_node_id, np.arange(3, dtype=np.int32))
    w.observe(call.output_node_id, np.arange(2, dtype=np.int32))
    ev = next(e for e in w.events if e.kind == kind)
    ev.validate()
    object.__setattr__(ev, name, getattr(ev, name)[: fewest - 1])
    with pytest.raises(ValidationError, match=rf"{kind}\.{name} must hold at least {fewest}|log-prob"):
        ev.validate()
