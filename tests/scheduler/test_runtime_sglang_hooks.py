"""SGLang switch hooks against a local stub HTTP server that records each request (no SGLang, no GPU)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import pytest

from sapwood.rollout.engines import EngineError
from sapwood.scheduler.runtime.sglang_hooks import SGLangSwitchHooks


class _Stub(BaseHTTPRequestHandler):
    log: ClassVar[list[tuple[str, dict]]] = []
    fail: ClassVar[dict[str, tuple[int, dict]]] = {}

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        self.log.append((self.path, body))
        status, answer = self.fail.get(self.path, (200, {"success": True, "message": ""}))
        data = json.dumps(answer).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        return None


@pytest.fixture()
def stub() -> Iterator[tuple[str, type[_Stub]]]:
    handler = type("Stub", (_Stub,), {"log": [], "fail": {}})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", handler
    server.shutdown()


def test_leave_and_enter_rollout_call_the_endpoints_in_order(stub) -> None:  # type: ignore[no-untyped-def]
    url, handler = stub
    hooks = SGLangSwitchHooks(url)
    left = hooks.leave_rollout()
    hooks.init_weight_group("10.0.0.1", 29500, 1, 2)
    entered = hooks.enter_rollout(["lm_head.weight"], ["bfloat16"], [[32000, 4096]], version=7)
    assert set(left) == {"abort", "release_memory"}
    assert set(entered) == {"resume_memory", "weight_load", "continue"}
    assert all(v >= 0 for v in [*left.values(), *entered.values()])
    assert [p for p, _ in handler.log] == ["/pause_generation", "/release_memory_occupation",
                                           "/init_weights_update_group", "/resume_memory_occupation",
                                           "/update_weights_from_distributed", "/continue_generation"]
    bodies = dict(handler.log)
    assert bodies["/pause_generation"] == {"mode": "abort"}
    assert bodies["/release_memory_occupation"] == {"tags": ["kv_cache", "weights"]}
    assert bodies["/init_weights_update_group"] == {"master_address": "10.0.0.1", "master_port": 29500,
                                                    "rank_offset": 1, "world_size": 2,
                                                    "group_name": "weight_update_group", "backend": "nccl"}
    assert bodies["/update_weights_from_distributed"] == {
        "names": ["lm_head.weight"], "dtypes": ["bfloat16"], "shapes": [[32000, 4096]],
        "group_name": "weight_update_group", "flush_cache": True, "weight_version": "7"}


def test_refusals_and_bad_arguments_are_clear_errors(stub) -> None:  # type: ignore[no-untyped-def]
    url, handler = stub
    hooks = SGLangSwitchHooks(url)
    handler.fail["/release_memory_occupation"] = (200, {"success": False, "message": "requests still running"})
    with pytest.raises(EngineError, match="refused: requests still running"):
        hooks.release_memory()
    handler.fail["/continue_generation"] = (500, {"error": "boom"})
    with pytest.raises(EngineError, match="HTTP 500"):
        hooks.resume()
    with pytest.raises(ValueError, match="pause mode"):
        hooks.pause("later")
    with pytest.raises(ValueError, match="rank_offset"):
        hooks.init_weight_group("h", 1, 0, 2)
    with pytest.raises(ValueError, match="one length"):
        hooks.update_weights_from_distributed(["a"], [], [[1]], version=1)
    with pytest.raises(EngineError, match="request failed"):
        SGLangSwitchHooks("http://127.0.0.1:9", timeout_s=1).flush_cache()
