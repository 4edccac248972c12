"""The gateway's JSON: orjson, with the standard library for what orjson refuses (NaN / Infinity literals,
integers beyond 64 bits), so every body the gateway accepted before still passes."""

from __future__ import annotations

import math

import pytest

from sapwood.gateway.json_codec import FastJSONResponse, dumps, loads


def test_round_trip_of_a_vllm_answer() -> None:
    answer = {"choices": [{"token_ids": [0, 151_935], "logprobs": {"token_logprobs": [-0.25, 0.0]},
                           "text": "héllo ✓"}], "usage": None}
    assert loads(dumps(answer)) == answer
    assert loads(dumps(answer).decode()) == answer


def test_what_orjson_refuses_falls_back_to_the_standard_library() -> None:
    got = loads(b'{"lp": -Infinity, "x": NaN, "big": 123456789012345678901234567890}')
    assert got["lp"] == -math.inf
    assert math.isnan(got["x"])
    assert got["big"] == 123456789012345678901234567890
    assert loads(dumps({"big": 2**70})) == {"big": 2**70}, "an int beyond 64 bits is written exactly"
    assert dumps({"lp": -math.inf}) == b'{"lp":null}', "a non-finite float is written as null"


@pytest.mark.parametrize("bad", [b"", b"{", b"[1,]", b"nul"])
def test_a_bad_body_is_a_value_error(bad: bytes) -> None:
    with pytest.raises(ValueError):
        loads(bad)


def test_the_response_renders_with_orjson() -> None:
    assert FastJSONResponse({"a": [1, 2.5]}).body == b'{"a":[1,2.5]}'
