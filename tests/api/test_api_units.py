"""Units without a server: settings, cursors, the response cache, tokenizers, key parsing."""

from __future__ import annotations

import base64

import pytest

from sapwood.api import ApiSettings, CharTokenizer
from sapwood.api.auth import parse_scopes, split_key
from sapwood.api.cache import ResponseCache
from sapwood.api.cursors import INT64_MAX, MAC_BYTES, Cursors
from sapwood.api.errors import AuthenticationError
from sapwood.api.tokenizer import load_tokenizer
from sapwood.platform.errors import ValidationError


@pytest.mark.parametrize(("value", "expected"), [("", []), (" , ", []), ("https://a.example", ["https://a.example"]),
                                                 ("https://a.example, https://b.example",
                                                  ["https://a.example", "https://b.example"])])
def test_cors_origins_from_a_comma_separated_setting(value: str, expected: list[str],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SAPWOOD_API_CORS_ORIGINS", value)
    assert ApiSettings().api_cors_origins == expected


def test_cursors_round_trip_and_reject_tampering() -> None:
    cursors = Cursors("secret-a")
    c = cursors.encode("executions-desc", 1796071199.079911, "3339b57a-e6e2-4b45-8503-4e0770fe6d48")
    assert cursors.decode(c, "executions-desc", (float, str)) == [1796071199.079911,
                                                                  "3339b57a-e6e2-4b45-8503-4e0770fe6d48"]
    raw = base64.urlsafe_b64decode(c + "=" * (-len(c) % 4))
    edited = raw[:MAC_BYTES] + raw[MAC_BYTES:].replace(b"1796", b"1797")  # same MAC, edited position
    bad_cursors = ("", "!!!", c[:-3], cursors.encode("executions-asc", 1.0, "x"),
                   cursors.encode("executions-desc", "1", "x"), cursors.encode("executions-desc", 1.0),
                   cursors.encode("executions-desc", True, "x"),
                   cursors.encode("executions-desc", 1e308 * 10, "x"),  # inf
                   base64.urlsafe_b64encode(edited).decode().rstrip("="),
                   Cursors("secret-b").encode("executions-desc", 1.0, "x"))  # another server's secret
    for bad in bad_cursors:
        with pytest.raises(ValidationError, match="cursor"):
            cursors.decode(bad, "executions-desc", (float, str))


@pytest.mark.parametrize("value", [INT64_MAX + 1, -(2**63) - 1, 10**40])
def test_signed_cursor_integers_are_range_checked(value: int) -> None:
    """Even a correctly signed cursor (a leaked secret) cannot carry an integer the store cannot compare."""
    cursors = Cursors("s")
    assert cursors.decode(cursors.encode("calls:e", INT64_MAX), "calls:e", (int,)) == [INT64_MAX]
    with pytest.raises(ValidationError, match="cursor"):
        cursors.decode(cursors.encode("calls:e", value), "calls:e", (int,))


def test_cursors_are_bound_to_their_resource() -> None:
    cursors = Cursors("s")
    c = cursors.encode("calls:execution-1", 5)
    with pytest.raises(ValidationError, match="cursor"):
        cursors.decode(c, "calls:execution-2", (int,))


def test_response_cache_is_bounded_by_bytes() -> None:
    cache = ResponseCache(400)
    for i in range(5):
        cache.put(i, (b"x" * 100, {}))
    assert len(cache) == 4
    assert cache.size_bytes == 400
    assert cache.get(0) is None
    assert cache.get(4) is not None
    cache.get(1)
    cache.put(9, (b"y" * 100, {}))
    assert cache.get(2) is None
    assert cache.get(1) is not None  # least recently used goes first
    cache.put("big", (b"z" * 101, {}))  # more than a quarter of the cache: not kept
    assert cache.get("big") is None


def test_lru_keeps_the_most_recently_used_items() -> None:
    from sapwood.api.cache import LRU

    lru: LRU[str, int] = LRU(2)
    lru.put("a", 1)
    lru.put("b", 2)
    assert lru.get("a") == 1
    lru.put("c", 3)
    assert lru.get("b") is None
    assert lru.get("a") == 1
    assert lru.get("c") == 3
    assert len(lru) == 2
    off: LRU[str, int] = LRU(0)
    off.put("a", 1)
    assert off.get("a") is None


def test_char_tokenizer() -> None:
    assert CharTokenizer().decode([72, 105, -1, 0xD800]) == "Hi\ufffd\ufffd"
    alpha = CharTokenizer("ab\n")
    assert alpha.decode(alpha.encode("ba\nab")) == "ba\nab"
    assert alpha.decode([5]) == "\ufffd"
    with pytest.raises(ValidationError, match="alphabet"):
        alpha.encode("c")
    assert load_tokenizer("none") is None
    assert isinstance(load_tokenizer("char"), CharTokenizer)
    assert isinstance(load_tokenizer("sapwood.api.tokenizer.char_tokenizer"), CharTokenizer)


def test_key_parsing() -> None:
    assert split_key(" 0123456789abcdef." + "s" * 43 + " ") == ("0123456789abcdef", "s" * 43)
    for bad in ("", "nodot", "0123456789abcdef.", "XYZ.secretsecretsecretsecret", "0123456789abcdef.bad secret!"):
        with pytest.raises(AuthenticationError):
            split_key(bad)
    assert parse_scopes("write read") == ["read", "write"]
    assert parse_scopes(["admin"]) == ["admin"]
    for bad in ("", "root", "read root"):
        with pytest.raises(ValidationError):
            parse_scopes(bad)


def test_version_reader_connection_settings_follow_the_url() -> None:
    import sqlalchemy as sa

    from sapwood.api.versions import VersionReader
    from sapwood.platform.storage.postgres.version_channel import PostgresVersionChannel

    socket_url = sa.create_engine("postgresql+psycopg://u:p@/sapwood?host=/run/postgresql")
    kw = PostgresVersionChannel(socket_url, statement_timeout_ms=250).connect_kwargs()
    assert kw["host"] == "/run/postgresql"
    assert kw["dbname"] == "sapwood"
    assert (kw["user"], kw["password"]) == ("u", "p")
    assert kw["options"] == "-c statement_timeout=250"
    assert kw["autocommit"] is True
    tcp = PostgresVersionChannel(sa.create_engine("postgresql+psycopg://db.example:6543/x"), statement_timeout_ms=1)
    assert {k: tcp.connect_kwargs().get(k) for k in ("host", "port", "user")} == {"host": "db.example", "port": 6543,
                                                                                   "user": None}
    assert not VersionReader(sa.create_engine("sqlite://"), statement_timeout_ms=1).native
