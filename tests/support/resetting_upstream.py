"""A real HTTP/1.1 socket server (no mock transport) that resets kept-alive connections as they are reused.

It answers the first request of each connection with a vLLM-style completion (keep-alive) and, when a
second request arrives on the same connection, closes it with a TCP reset (``SO_LINGER`` 0) before
answering: what a uvicorn upstream does when its keep-alive timer fires while the client's next request
is still unread (the client then sees ``httpx.ReadError`` with an empty message).
``reset_every``: reset every request instead (an upstream that never answers).
"""

from __future__ import annotations

import json
import socket
import struct
import threading
from types import TracebackType


class ResettingUpstream:
    """``url``: its base URL; ``answered`` / ``reset``: requests answered and connections reset so far."""

    def __init__(self, *, reset_every: bool = False) -> None:
        self.reset_every = reset_every
        self.answered = 0
        self.reset = 0
        self._sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def __enter__(self) -> ResettingUpstream:
        self._thread.start()
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self._sock.close()
        self._thread.join(5)

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._connection, args=(conn,), daemon=True).start()

    def _connection(self, conn: socket.socket) -> None:
        with conn:
            served = 0
            buf = b""
            while True:
                while b"\r\n\r\n" not in buf:
                    data = conn.recv(65536)
                    if not data:
                        return
                    buf += data
                head, _, rest = buf.partition(b"\r\n\r\n")
                length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)
                while len(rest) < length:
                    rest += conn.recv(65536)
                body, buf = json.loads(rest[:length] or b"{}"), rest[length:]
                if served >= 1 or self.reset_every:  # a reused connection (or every one): reset, unanswered
                    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    self.reset += 1
                    return
                conn.sendall(self._answer(body))
                served += 1
                self.answered += 1

    @staticmethod
    def _answer(body: dict[str, object]) -> bytes:
        prompt = list(body.get("prompt") or [1])  # type: ignore[call-overload]
        out = [5, 6]
        choice = {"index": 0, "text": "ab", "finish_reason": "length", "prompt_token_ids": prompt,
                  "token_ids": out, "logprobs": {"tokens": ["a", "b"], "token_logprobs": [-0.5, -0.25],
                                                 "top_logprobs": [{"a": -0.5}, {"b": -0.25}]}}
        payload = json.dumps({"id": "cmpl-1", "object": "text_completion", "model": "tiny",
                              "choices": [choice]}).encode()
        return (b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: "
                + str(len(payload)).encode() + b"\r\n\r\n" + payload)
