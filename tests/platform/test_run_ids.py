"""One run-id rule for the recorder SDK, ingest (event validation) and the API."""

from __future__ import annotations

import pytest

from sapwood.platform.errors import ValidationError
from sapwood.platform.events import ExecutionStarted
from sapwood.platform.run_ids import check_run_id
from sapwood.rollout.recorder import Recorder

BAD = ["a/b", "x" * 129, "-leading-dash", "", "spa ce", "nul\x00"]
GOOD = ["run-7", "a" * 128, "r.1_2:3@4-5"]


@pytest.mark.parametrize("run_id", BAD)
def test_an_execution_with_a_run_id_the_api_cannot_open_is_refused(run_id: str) -> None:
    event = ExecutionStarted(execution_id="00000000-0000-4000-8000-000000000000", seq=0, run_id=run_id, task_id="t")
    with pytest.raises(ValidationError, match=r"run_id|run id"):
        event.validate()


@pytest.mark.parametrize("run_id", BAD)
def test_the_recorder_refuses_it_when_it_is_made(run_id: str) -> None:
    with pytest.raises(ValidationError, match="run id"):
        Recorder(run_id=run_id)


@pytest.mark.parametrize("run_id", GOOD)
def test_ids_in_the_rule_pass_everywhere(run_id: str) -> None:
    assert check_run_id(run_id) == run_id
    assert Recorder(run_id=run_id).run_id == run_id
    ExecutionStarted(execution_id="00000000-0000-4000-8000-000000000000", seq=0, run_id=run_id,
                     task_id="t").validate()
