"""Limits the HTTP server enforces while reading (sapwood.api.http_protocol), on a real socket."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sapwood.api import ApiSettings, create_app
from sapwood.api.http_protocol import ConnectionLimits, guarded_protocol
from sapwood.platform.store import Store
from tests.support.live_server import sapwood_serve, serve_in_thread

LIMITS = ConnectionLimits(max_header_bytes=8192, max_header_count=50, read_timeout_s=0.5,
                          max_connections_per_client=3)
HEALTHZ = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[str, int]]:
    store = Store.open(f"sqlite:///{tmp_path / 'limits.db'}")
    try:
        with serve_in_thread(create_app(ApiSettings(), store=store), http=guarded_protocol(LIMITS)) as base:
            host, port = base.removeprefix("http://").split(":")
            yield host, int(port)
    finally:
        store.close()


def _connect(server: tuple[str, int]) -> socket.socket:
    return socket.create_connection(server, timeout=10)


def _read_answer(sock: socket.socket) -> bytes:
    """Everything until the server closes (or 64 KB)."""
    chunks = []
    while sum(map(len, chunks)) < 65536:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks)


def test_a_64_mb_header_is_refused_after_the_limit_not_after_64_mb(server: tuple[str, int]) -> None:
    sent = 0
    with _connect(server) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: ")
        chunk = b"a" * 65536
        try:
            while sent < 64 << 20:
                sock.sendall(chunk)
                sent += len(chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass
        answer = _read_answer(sock)
    assert sent < 16 << 20, f"the server read {sent} bytes of one header before refusing it"
    assert answer.startswith(b"HTTP/1.1 431") or answer == b"", answer[:200]  # a reset may eat the 431


def test_a_header_over_the_size_limit_gets_431(server: tuple[str, int]) -> None:
    with _connect(server) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 9000 + b"\r\n\r\n")
        assert _read_answer(sock).startswith(b"HTTP/1.1 431")


def test_too_many_headers_get_431(server: tuple[str, int]) -> None:
    headers = b"".join(b"X-%d: 1\r\n" % i for i in range(60))
    with _connect(server) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + headers + b"\r\n")
        answer = _read_answer(sock)
    assert answer.startswith(b"HTTP/1.1 431"), answer[:200]


def test_headers_within_the_limits_are_served(server: tuple[str, int]) -> None:
    headers = b"".join(b"X-%d: 1\r\n" % i for i in range(40))
    with _connect(server) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n" + headers + b"\r\n")
        assert _read_answer(sock).startswith(b"HTTP/1.1 200")


@pytest.mark.parametrize("partial", [b"", b"GET /healthz HTTP/1.1\r\nHost: x\r\n",
                                     b"POST /v1/runs HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n{"])
def test_a_half_sent_request_is_timed_out_with_408(server: tuple[str, int], partial: bytes) -> None:
    with _connect(server) as sock:
        sock.sendall(partial)
        answer = _read_answer(sock)  # the socket's 10 s timeout fails the test if the server never closes
    if partial.startswith(b"POST"):  # the key check answers 401 before the body: then the connection closes
        assert answer.startswith((b"HTTP/1.1 401", b"HTTP/1.1 408")), answer[:200]
    else:
        assert answer.startswith(b"HTTP/1.1 408"), answer[:200]


def test_one_client_holds_at_most_its_connection_cap(server: tuple[str, int]) -> None:
    held = [_connect(server) for _ in range(LIMITS.max_connections_per_client)]
    try:
        for sock in held:  # a full answer on each: the server has counted it
            sock.sendall(HEALTHZ)
            assert sock.recv(65536).startswith(b"HTTP/1.1 200")
        with _connect(server) as extra:
            answer = _read_answer(extra)
        assert answer.startswith(b"HTTP/1.1 503"), answer[:200]
    finally:
        held.pop().close()
    deadline = time.monotonic() + 10
    while True:  # the closed connection is uncounted when the server sees it closed
        with _connect(server) as sock:
            sock.sendall(HEALTHZ)
            answer = sock.recv(65536)
        if answer.startswith(b"HTTP/1.1 200") or time.monotonic() > deadline:
            break
    for sock in held:
        sock.close()
    assert answer.startswith(b"HTTP/1.1 200"), answer[:200]


def test_sapwood_serve_runs_the_guarded_protocol(tmp_path: Path) -> None:
    env = {"SAPWOOD_DATABASE_URL": f"sqlite:///{tmp_path / 'serve.db'}", "SAPWOOD_API_MAX_HEADER_COUNT": "5",
           "SAPWOOD_API_REQUEST_READ_TIMEOUT_S": "0.5"}
    with sapwood_serve(env, "--log-level", "warning") as base:
        host, port = base.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + b"".join(b"X-%d: 1\r\n" % i for i in range(8))
                         + b"\r\n")
            too_many = _read_answer(sock)
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            silent = _read_answer(sock)
    assert too_many.startswith(b"HTTP/1.1 431"), too_many[:200]
    assert b"text/plain" in too_many.split(b"\r\n\r\n")[0]  # the protocol's answer, not the app's JSON one
    assert silent.startswith(b"HTTP/1.1 408"), silent[:200]
