"""Switch hooks for a cell served by an SGLang server, over SGLang's HTTP endpoints.

Endpoints used (request bodies as SGLang's ``io_struct`` request classes define them):

* ``POST /pause_generation`` ``{"mode": "abort" | "retract" | "in_place"}`` and ``POST /continue_generation``;
* ``POST /release_memory_occupation`` / ``POST /resume_memory_occupation`` ``{"tags": [...]}`` (None: all;
  tags such as ``kv_cache`` and ``weights``);
* ``POST /init_weights_update_group`` ``{master_address, master_port, rank_offset, world_size, group_name,
  backend}`` and ``POST /update_weights_from_distributed`` ``{names, dtypes, shapes, group_name, flush_cache,
  weight_version}`` (the trainer then broadcasts each tensor in that group);
* ``POST /flush_cache``.

Leaving rollout: ``pause_generation(mode="abort")`` returns every running request to its caller (the
router re-issues it with the same input ids on another cell, whose prefill recomputes the prefix:
SGLang's HTTP API has no cross-server KV export, so this is the recompute path as well), then
``release_memory_occupation`` frees KV cache and weights for training. Entering rollout:
``resume_memory_occupation``, the weights from the trainer's distributed group, ``continue_generation``.

Only exercised against a local stub HTTP server in the tests; not verified on a real SGLang server or GPU.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from sapwood.rollout.engines import EngineError

if TYPE_CHECKING:
    import httpx

__all__ = ["SGLangSwitchHooks"]

PAUSE_MODES = ("abort", "retract", "in_place")


class SGLangSwitchHooks:
    """The switch-protocol calls for one SGLang server at ``base_url``; each returns seconds spent."""

    def __init__(self, base_url: str, *, client: httpx.Client | None = None, timeout_s: float = 600.0) -> None:
        import httpx

        self.base_url = base_url.rstrip("/")
        self.client = client or httpx.Client(timeout=timeout_s)

    def _post(self, path: str, body: dict[str, Any] | None = None) -> float:
        import httpx

        t0 = time.perf_counter()
        try:
            resp = self.client.post(f"{self.base_url}{path}", json=body or {})
            resp.raise_for_status()
        except httpx.HTTPStatusError as exc:
            raise EngineError(f"SGLang {path} answered HTTP {exc.response.status_code}: "
                              f"{exc.response.text[:500]}") from exc
        except httpx.HTTPError as exc:
            raise EngineError(f"SGLang {path} request failed: {exc}") from exc
        if resp.content:
            try:
                data = resp.json()
            except ValueError:
                data = None
            if isinstance(data, dict) and data.get("success") is False:
                raise EngineError(f"SGLang {path} refused: {data.get('message', '')}")
        return time.perf_counter() - t0

    def pause(self, mode: str = "abort") -> float:
        """Stop generating; ``abort`` returns running requests to their callers."""
        if mode not in PAUSE_MODES:
            raise ValueError(f"pause mode must be one of {PAUSE_MODES}, got {mode!r}")
        return self._post("/pause_generation", {"mode": mode})

    def resume(self) -> float:
        return self._post("/continue_generation", {})

    def release_memory(self, tags: Sequence[str] | None = None) -> float:
        return self._post("/release_memory_occupation", {"tags": list(tags) if tags is not None else None})

    def resume_memory(self, tags: Sequence[str] | None = None) -> float:
        return self._post("/resume_memory_occupation", {"tags": list(tags) if tags is not None else None})

    def flush_cache(self) -> float:
        return self._post("/flush_cache")

    def init_weight_group(self, master_address: str, master_port: int, rank_offset: int, world_size: int, *,
                          group_name: str = "weight_update_group", backend: str = "nccl") -> float:
        """Join the trainer's process group that weights are broadcast in."""
        if not 0 < rank_offset < world_size:
            raise ValueError(f"rank_offset must be in [1, world_size), got {rank_offset} of {world_size} "
                             "(rank 0 is the trainer that broadcasts)")
        return self._post("/init_weights_update_group", {
            "master_address": master_address, "master_port": int(master_port), "rank_offset": int(rank_offset),
            "world_size": int(world_size), "group_name": group_name, "backend": backend})

    def update_weights_from_distributed(self, names: Sequence[str], dtypes: Sequence[str],
                                        shapes: Sequence[Sequence[int]], *, version: int,
                                        group_name: str = "weight_update_group", flush_cache: bool = True) -> float:
        """Receive ``names`` (with their dtypes and shapes) from the group's broadcast as weights ``version``."""
        if not len(names) == len(dtypes) == len(shapes) or not names:
            raise ValueError(f"names, dtypes and shapes must be non-empty and of one length, got "
                             f"{len(names)}, {len(dtypes)}, {len(shapes)}")
        return self._post("/update_weights_from_distributed", {
            "names": list(names), "dtypes": list(dtypes), "shapes": [list(map(int, s)) for s in shapes],
            "group_name": group_name, "flush_cache": flush_cache, "weight_version": str(version)})

    # -- the protocol's phases ----------------------------------------------------------------------
    def leave_rollout(self) -> dict[str, float]:
        """Abort running requests (the router re-issues them), then free KV cache and weights."""
        return {"abort": self.pause("abort"), "release_memory": self.release_memory(["kv_cache", "weights"])}

    def enter_rollout(self, names: Sequence[str], dtypes: Sequence[str], shapes: Sequence[Sequence[int]], *,
                      version: int, group_name: str = "weight_update_group") -> dict[str, float]:
        """Take memory back, load weights ``version`` from the trainer's group, serve again."""
        phases = {"resume_memory": self.resume_memory(["weights", "kv_cache"])}
        phases["weight_load"] = self.update_weights_from_distributed(names, dtypes, shapes, version=version,
                                                                     group_name=group_name)
        phases["continue"] = self.resume()
        return phases

    def close(self) -> None:
        self.client.close()
