"""Property-based requests generated from the OpenAPI schema, with every check schemathesis has,
on PostgreSQL and SQLite.

Every operation gets positive and negative (schema-violating) requests with generated parameters,
and, where it has path parameters, positive requests against real stored ids. (Driven through
hypothesis directly: schemathesis' pytest plugin does not support pytest 9's node ids yet.)
"""

from __future__ import annotations

from typing import Any

import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import CHECKS as REGISTRY
from schemathesis.checks import load_all_checks

from sapwood.api import ApiSettings, create_app
from sapwood.platform.store import Store
from tests.support.api_client import calls_of, load_executions, make_keys

load_all_checks()
#: Every check schemathesis has (``--checks all``): no 5xx, documented status codes, content types and
#: headers, schema-conforming bodies, negative data rejected, positive data accepted, Allow on 405, ...
CHECKS = REGISTRY.get_all()
EXAMPLES = 10


def checked(strategy: Any, headers: dict[str, str], *, positive: bool) -> Any:
    """A hypothesis test sending the strategy's cases and running every check on the answers."""

    @given(case=strategy)
    @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    def run(case: schemathesis.Case) -> None:
        if positive and case.query:
            # a cursor is valid only as this server signed it for this listing: a generated one is
            # schema-valid and still (rightly) refused; negative cases keep theirs
            case.query.pop("cursor", None)
        case.call_and_validate(headers=headers, checks=CHECKS)

    return run


def test_generated_requests_never_get_a_server_error(any_store: Store) -> None:
    pg_store = any_store
    writers = load_executions(pg_store, 2)
    keys = make_keys(pg_store)
    w = writers[1]
    real = {"execution_id": w.execution_id, "node_id": w.leaves()[0], "call_id": calls_of(w)[-1].event_id,
            "run_id": "rollout-a", "key_id": keys.read.split(".")[0]}
    app = create_app(ApiSettings(tokenizer="char"), store=pg_store)
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    headers = keys.headers("all")
    failures: list[str] = []
    n_operations = 0
    for result in schema.get_all_operations():
        operation = result.ok()
        n_operations += 1
        names = {p.name for p in operation.path_parameters}
        variants: list[tuple[str, dict[str, Any]]] = [
            ("positive", {"generation_mode": GenerationMode.POSITIVE}),
            ("negative", {"generation_mode": GenerationMode.NEGATIVE}),
        ]
        if names and operation.method.upper() != "DELETE":
            variants.append(("positive, stored ids", {"generation_mode": GenerationMode.POSITIVE,
                                                      "path_parameters": {n: real[n] for n in names}}))
        for label, kwargs in variants:
            run = checked(operation.as_strategy(**kwargs), headers, positive=label.startswith("positive"))
            try:
                run()
            except Unsatisfiable:  # nothing to negate (an operation without parameters or body)
                assert label == "negative", f"{operation.method} {operation.path}: no {label} cases"
            except (Exception, BaseExceptionGroup) as exc:  # collect every operation's failure, report them together
                failures.append(f"{operation.method.upper()} {operation.path} ({label}): {exc}"[:2000])
    assert n_operations >= 23
    assert failures == [], "\n\n".join(failures)
