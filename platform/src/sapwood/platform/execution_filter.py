"""Which executions a query or a run selects (:class:`ExecutionFilter`), and the JSON number types it uses.

Plain data that every side imports: the run functions (:mod:`sapwood.platform.runs`), the API's
schemas and the storage reads, whose SQL for it is
:func:`sapwood.platform.storage.runs_sql.execution_condition`.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StringConstraints

from sapwood.platform.events.base import ExecutionStatus
from sapwood.platform.json_values import DOUBLE_MAX, EXACT_INT_MAX, number_problem


def _json_int(value: Any) -> Any:
    """JSON's integers (``3``, ``3.0``), not booleans or numeric strings (pydantic's lax mode takes both)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError("expected an integer")
    if isinstance(value, float):
        if not value.is_integer():
            raise ValueError("expected an integer")
        return int(value)
    return value


def _json_number(value: Any) -> Any:
    """JSON's numbers that are IEEE-754 doubles exactly (:mod:`sapwood.platform.json_values`), not booleans
    or numeric strings."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError("expected a number")
    problem = number_problem(value)
    if problem is not None:
        raise ValueError(problem)
    return value


#: A number as JSON Schema means it (what the OpenAPI schema promises clients).
JsonNumber = Annotated[float, BeforeValidator(_json_number)]
#: A non-negative int32 (policy versions, seeds, revisions) as a JSON integer.
NonNegativeInt32 = Annotated[int, Field(ge=0, le=2**31 - 1), BeforeValidator(_json_int)]

#: Text a filter matches: no NUL (PostgreSQL text cannot hold it), at most 256 characters.
FilterText = Annotated[str, StringConstraints(max_length=256, pattern=r"^[^\x00]*$")]
#: Bounds of a JSON number the store holds (finite doubles; integers within ±2**53 stay integers).
JSON_NUMBER_MIN, JSON_NUMBER_MAX = -DOUBLE_MAX, DOUBLE_MAX
JSON_INT_MIN, JSON_INT_MAX = -EXACT_INT_MAX, EXACT_INT_MAX


class ExecutionFilter(BaseModel):
    """Which executions a query or a run selects; every field is optional and they AND together."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    run_id: FilterText | None = Field(default=None, description="executions recorded under this run id")
    task_id: FilterText | None = None
    task_family: FilterText | None = None
    status: list[ExecutionStatus] | None = None
    min_policy_version: NonNegativeInt32 | None = None
    max_policy_version: NonNegativeInt32 | None = None
    min_score: JsonNumber | None = Field(default=None, description="on the reward, or the partial score if unrewarded")
    max_score: JsonNumber | None = None
    started_after: JsonNumber | None = Field(default=None, description="unix seconds")
    started_before: JsonNumber | None = None


__all__ = ["JSON_INT_MAX", "JSON_INT_MIN", "JSON_NUMBER_MAX", "JSON_NUMBER_MIN", "ExecutionFilter", "FilterText",
           "JsonNumber", "NonNegativeInt32"]
