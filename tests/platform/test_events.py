import numpy as np
import pytest

from sapwood.platform.errors import DTypeError, LengthMismatchError, TokenRangeError, ValidationError
from sapwood.platform.events import ExecutionFinished, ModelCall, PartialScore, PolicyPublished
from sapwood.platform.tokens import input_digest


def _call(**kw) -> ModelCall:
    base = dict(execution_id="00000000-0000-4000-8000-000000000001", seq=1, appended=[1, 2, 3],
                input_digest=input_digest([1, 2, 3]), output_ids=[4, 5], output_logprobs=[-0.1, -0.2])
    base.update(kw)
    return ModelCall(**base)


def test_valid_call_passes() -> None:
    _call().validate()


def test_float_token_ids_are_a_dtype_error() -> None:
    with pytest.raises(DTypeError, match="expected integer token ids"):
        _call(output_ids=np.array([1.0, 2.0]))


def test_negative_and_out_of_vocab_ids() -> None:
    with pytest.raises(TokenRangeError, match="must be ≥ 0"):
        _call(output_ids=[-1, 2]).check_vocab(100)
    with pytest.raises(TokenRangeError, match=r"out of vocabulary \(expected < vocab_size=100\)"):
        _call(output_ids=[1, 100]).check_vocab(100)


def test_output_and_logprob_lengths_must_match() -> None:
    with pytest.raises(LengthMismatchError, match="2 output ids but 1 log-probs"):
        _call(output_logprobs=[-0.1]).validate()


def test_positive_logprobs_rejected() -> None:
    with pytest.raises(DTypeError, match="log-probabilities ≤ 0"):
        _call(output_logprobs=[0.5, -0.1]).validate()


def test_bad_kind_and_digest_format() -> None:
    with pytest.raises(ValidationError, match="call_kind must be one of"):
        _call(call_kind="chat").validate()
    with pytest.raises(ValidationError, match="32-char hex"):
        _call(input_digest="abc").validate()


def test_finish_status_and_policy_scope() -> None:
    with pytest.raises(ValidationError, match="status must be one of"):
        ExecutionFinished(execution_id="00000000-0000-4000-8000-000000000001", seq=2, status="done").validate()
    with pytest.raises(ValidationError, match="run-scoped"):
        PolicyPublished(run_id="r", version=1, execution_id="00000000-0000-4000-8000-000000000001").validate()


def test_scalar_fields_are_the_non_envelope_non_array_fields_in_order() -> None:
    """Every kind (a segment boundary has a single scalar field: the one-name getter path)."""
    import dataclasses

    from sapwood.platform.events import EVENT_TYPES, CellHeartbeat, CellRegistered, RoleAssigned, SwitchPhase
    from sapwood.platform.synthetic import SynthConfig, synthetic_execution

    envelope = {"event_id", "execution_id", "seq", "schema_version", "created_at"}
    seen = set()
    others = [PolicyPublished(run_id="r", version=1, checkpoint="c"), PartialScore(score=0.5, components={"a": 1.0}),
              CellRegistered(cell_id="c"), CellHeartbeat(cell_id="c"), RoleAssigned(cell_id="c", role="train"),
              SwitchPhase(cell_id="c", phase="load", duration_s=1.0)]
    for ev in [*synthetic_execution(SynthConfig(seed=3, calls=12)).events, *others]:
        arrays = {n for n, _ in ev.arrays}
        names = [f.name for f in dataclasses.fields(ev) if f.name not in envelope | arrays]
        assert ev.scalar_fields() == {n: getattr(ev, n) for n in names}
        assert list(ev.scalar_fields()) == names
        seen.add(type(ev))
    assert seen == set(EVENT_TYPES.values())
