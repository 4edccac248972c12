"""docs/wire-format.md is enough to write a producer: events built from the spec alone
(tests/support/spec_producer.py, no sapwood import) are accepted by ingest over real Kafka and reconstruct
exactly; their headers match the published JSON Schema (docs/wire-header.schema.json)."""

from __future__ import annotations

import ast
import copy
import json
from pathlib import Path

import jsonschema
import numpy as np
import pytest
import sqlalchemy as sa

from sapwood.platform import schema as t
from sapwood.platform.events import derive_node_id
from sapwood.platform.store import Store
from sapwood.platform.tokens import input_digest
from tests.support import spec_producer as spec
from tests.support.kafka_ingest import caught_up, create_topic, ingest_config, raw_producer, running_ingest, wait_until

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = json.loads((ROOT / "docs" / "wire-header.schema.json").read_text())


def test_the_spec_producer_imports_no_sapwood() -> None:
    tree = ast.parse((Path(__file__).parents[1] / "support" / "spec_producer.py").read_text())
    modules = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    modules |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert {m.split(".")[0] for m in modules} <= {"__future__", "hashlib", "json", "struct", "time", "uuid",
                                                  "dataclasses", "typing", "zstandard"}


def test_the_examples_in_the_spec_hold() -> None:
    text = (ROOT / "docs" / "wire-format.md").read_text()
    event_id = "00000000-0000-4000-8000-000000000000"
    assert f"`{spec.node_id(event_id, 'node')}`" in text
    assert spec.node_id(event_id, "node") == derive_node_id(event_id, "node")
    assert f"`{spec.input_digest([1, 2, 3])}`" in text
    assert spec.input_digest([1, 2, 3]) == input_digest([1, 2, 3])


def _execution(compress: str) -> spec.SpecExecution:
    """Every execution-scoped kind, a fork, a compaction and a full-token call after it."""
    ex = spec.SpecExecution(run_id="spec-run", task_id="spec-task", compress=compress)
    ex.start(vocab_size=1000)
    task = list(range(100, 120))
    root = ex.prompt(list(range(40)) + task)
    out = ex.call(root, [1, 2], [3, 4, 5], [-0.5, -0.25, -1.0])
    obs = ex.observe(out, [6, 7, 8, 9])
    ex.fork(obs, 2)
    side = ex.call(obs, [10], [11, 12], [-0.1, -0.2], drift_at=0)  # drifted at the first input id
    ex.observe(side, [13])
    summary = ex.call(obs, [14], [15, 16], [-0.3, -0.4], kind="summary")
    seg = ex.compact(summary, [*task, 15, 16])
    out1 = ex.call(seg, [17], [18], [-0.6])
    obs1 = ex.observe(out1, [19, 20])
    leaf = ex.call(None, ex.contexts[obs1] + [21, 22], [23], [-0.7])  # full-token input after the compaction
    ex.score(0.5, 0)
    ex.finish(1.0, leaf)
    return ex


def test_headers_match_the_published_schema() -> None:
    validator = jsonschema.Draft202012Validator(SCHEMA)
    ex = _execution("none")
    _, policy_header = spec.policy_published("spec-run", 1)
    for header in [*ex.headers, policy_header]:
        validator.validate(header)
    call = next(h for h in ex.headers if h["kind"] == "model_call")
    for broken, what in [({**call, "fields": {**call["fields"], "input_digest": "xyz"}}, "input_digest"),
                         ({**call, "arrays": [["output_ids", "<i8", 3]]}, "dtype"),
                         ({**call, "fields": {**call["fields"], "parent_id": None}}, "unknown field"),
                         ({**policy_header, "seq": 0}, "run-scoped seq"),
                         ({k: v for k, v in call.items() if k != "created_at"}, "created_at"),
                         ({**call, "fields": {**call["fields"], "drift_at": 3}}, "drift_at unchecked"),
                         ({**call, "fields": {**call["fields"], "drift_checked": True, "drift_at": -1}}, "drift_at"),
                         ({**call, "fields": {**call["fields"], "drift_checked": 1}}, "drift_checked")]:
        assert not validator.is_valid(broken), what


@pytest.mark.parametrize("compress", ["none", "sized", "streamed"])
def test_spec_events_are_accepted_and_reconstruct_exactly(pg_url: str, kafka_bootstrap: str, compress: str) -> None:
    topic = create_topic(kafka_bootstrap, 2)
    store = Store.open(pg_url)
    executions = [_execution(compress) for _ in range(2)]
    policy, _ = spec.policy_published(f"spec-run-{compress}", 3)
    producer = raw_producer(kafka_bootstrap)
    for ex in executions:
        for value, key in ex.records:
            producer.send(topic, value=value, key=key)
    producer.send(topic, value=policy, key=f"spec-run-{compress}".encode())
    # a byte-identical replay of one execution: duplicates, not dead letters
    for value, key in copy.copy(executions[0].records):
        producer.send(topic, value=value, key=key)
    producer.flush(30)
    producer.close()
    config = ingest_config(pg_url, kafka_bootstrap, topic)
    with running_ingest(config) as service:
        wait_until(lambda: caught_up(store.engine, kafka_bootstrap, topic, config.group), 60, "ingest to catch up")
        duplicates = service.stats.duplicates
    with store.engine.connect() as conn:
        letters = conn.execute(sa.select(t.dead_letters.c.reason, t.dead_letters.c.message)).all()
        calls = dict(conn.execute(sa.select(t.calls.c.call_id, t.calls.c.segment)).all())
        drift = conn.execute(sa.select(t.calls.c.drift_checked, t.calls.c.drift_at, sa.func.count())
                             .group_by(t.calls.c.drift_checked, t.calls.c.drift_at)
                             .order_by(t.calls.c.drift_checked)).all()
        finished = conn.execute(sa.select(t.executions.c.status).where(
            t.executions.c.execution_id.in_([ex.execution_id for ex in executions]))).scalars().all()
    assert letters == [], letters
    assert duplicates == len(executions[0].records)
    assert finished == ["success", "success"]
    assert [tuple(r) for r in drift] == [(False, None, 8), (True, 0, 2)], "one drifted call per execution"
    for ex in executions:
        for call_id, full in ex.inputs.items():
            np.testing.assert_array_equal(store.reconstruct_input(call_id), np.array(full, dtype=np.int32))
        last = list(ex.inputs)[-1]
        assert calls[last] == 1, "the full-token call after the compaction is in segment 1"
