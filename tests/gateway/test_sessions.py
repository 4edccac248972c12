"""Naming sessions by path prefix or headers, finishing them, and the idle timeout."""

from __future__ import annotations

import pytest

from sapwood.gateway.sessions import SessionError, SessionTable, resolve


def test_path_prefix_names_the_session_and_is_stripped() -> None:
    ref = resolve("/s/abc-1/v1/chat/completions", {"X-Run-Id": "r1"})
    assert (ref.session_id, ref.path, ref.labels) == ("abc-1", "/v1/chat/completions", {"run": "r1"})


def test_headers_name_the_session_and_its_labels() -> None:
    headers = {"x-session-id": "s9", "X-Parent-Session-Id": "s1", "X-Task-Family": "swe", "X-Policy-Version": "7"}
    ref = resolve("/v1/completions", headers)
    assert ref.session_id == "s9"
    assert ref.path == "/v1/completions"
    assert ref.labels == {"parent_session": "s1", "task_family": "swe", "policy_version": "7"}


@pytest.mark.parametrize(
    ("path", "headers", "message"),
    [
        ("/v1/completions", {}, "no session"),
        ("/s//v1/completions", {}, "bad session prefix"),
        ("/s/a/v1/completions", {"X-Session-Id": "b"}, "X-Session-Id says"),
    ],
)
def test_bad_session_names_are_refused_clearly(path: str, headers: dict[str, str], message: str) -> None:
    with pytest.raises(SessionError, match=message):
        resolve(path, headers)


def test_idle_sessions_end_as_timeout_at_the_boundary() -> None:
    table = SessionTable(idle_timeout_s=10.0)
    table.touch(resolve("/s/a/v1/x", {}), now=0.0)
    table.touch(resolve("/s/b/v1/x", {}), now=5.0)
    assert table.expire(now=9.999) == []
    expired = table.expire(now=10.0)
    assert [(s.session_id, s.status) for s in expired] == [("a", "timeout")]
    assert list(table.open) == ["b"]


def test_finish_closes_and_unknown_sessions_are_named() -> None:
    table = SessionTable(idle_timeout_s=1.0)
    table.touch(resolve("/s/a/v1/x", {}), now=0.0)
    assert table.finish("a", "success").status == "success"
    with pytest.raises(KeyError, match="no open session 'a'"):
        table.finish("a", "success")
    with pytest.raises(ValueError, match="idle_timeout_s must be > 0"):
        SessionTable(idle_timeout_s=0)


def test_the_timeout_boundary_holds_where_the_float_difference_rounds_below_it() -> None:
    last = 261984.03134488701  # (last + 600.0) - last rounds below 600.0
    assert (last + 600.0) - last < 600.0
    table = SessionTable(idle_timeout_s=600.0)
    table.touch(resolve("/s/a/v1/x", {}), now=last)
    assert [s.session_id for s in table.expire(now=last + 600.0)] == ["a"]
