"""Inference engines behind one interface: token ids in, token ids and log-probs out.

* :class:`SGLangEngine` — an SGLang server's native ``/generate`` endpoint, called with
  ``input_ids`` and ``return_logprob: true``; output ids and log-probs are taken from the
  response's ``meta_info.output_token_logprobs`` (``[logprob, token_id, text]`` triples),
  never re-tokenized from text.
* ``LocalTorchEngine`` (:mod:`sapwood.rollout.torch_engine`, not part of the recorder SDK: it
  imports the learner's ``TinyActorCritic``) samples from the tiny model on CPU.

Every call returns a :class:`Generation` that names the policy version that served it, so
the recorder can log it (TITO ``policy_version``) and the learner can measure staleness.
"""

from __future__ import annotations

import abc
import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from sapwood.platform.errors import SapwoodError, ValidationError

if TYPE_CHECKING:
    import httpx

__all__ = [
    "Engine",
    "EngineError",
    "Generation",
    "LatestPolicy",
    "SGLangEngine",
    "SamplingParams",
    "load_model_state",
]

#: Returns the newest published ``(version, checkpoint path)`` of a run, or None.
LatestPolicy = Callable[[], "tuple[int, str] | None"]


class EngineError(SapwoodError):
    """The engine failed or answered something that cannot be recorded."""


@dataclass(frozen=True)
class SamplingParams:
    """Sampling parameters of one call (the subset both engines understand)."""

    temperature: float = 1.0
    """Softmax temperature (> 0)."""
    top_p: float = 1.0
    """Nucleus sampling mass in (0, 1]."""
    max_new_tokens: int = 16
    """Most tokens to generate."""
    stop_token_ids: tuple[int, ...] = ()
    """Generation stops after emitting one of these (the stop token is part of the output)."""

    def __post_init__(self) -> None:
        if not self.temperature > 0:
            raise ValidationError(f"temperature must be > 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValidationError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.max_new_tokens < 1:
            raise ValidationError(f"max_new_tokens must be ≥ 1, got {self.max_new_tokens}")

    def to_dict(self) -> dict[str, Any]:
        """As recorded in TITO events (and sent to SGLang)."""
        d: dict[str, Any] = {"temperature": self.temperature, "top_p": self.top_p,
                             "max_new_tokens": self.max_new_tokens}
        if self.stop_token_ids:
            d["stop_token_ids"] = list(self.stop_token_ids)
        return d


@dataclass(frozen=True)
class Generation:
    """What one engine call produced."""

    output_ids: np.ndarray
    """[n] int32 generated token ids (n ≥ 1)."""
    logprobs: np.ndarray
    """[n] float32 log π_rollout of each generated token, as the engine computed it."""
    policy_version: int
    """Weights version that served the call."""
    finish_reason: str
    """``stop`` (a stop token) or ``length`` (``max_new_tokens``)."""
    timings: dict[str, float] = field(default_factory=dict)
    """Wall-clock timings, e.g. ``latency_s``."""


class Engine(abc.ABC):
    """An inference engine: ``generate(input_ids, params)`` → :class:`Generation`."""

    #: Recorded as the execution's ``engine``.
    name: str = "engine"

    @property
    @abc.abstractmethod
    def policy_version(self) -> int:
        """Version of the weights the next call will be served with (as far as known)."""

    @abc.abstractmethod
    def generate(self, input_ids: Sequence[int], params: SamplingParams) -> Generation:
        """Generate from exactly ``input_ids`` (no template, no re-tokenization)."""

    #: Polled for ``(version, checkpoint)`` of the newest published policy (None: never switch).
    latest: LatestPolicy | None = None
    refresh_interval_s: float = 0.0
    _last_check: float = -float("inf")

    def refresh(self) -> bool:
        """Switch to the newest published policy if there is a newer one; True if it switched."""
        return False

    def _newer_policy(self, force: bool) -> tuple[int, str] | None:
        """``(version, checkpoint)`` of a newer published policy, polling ``latest`` at most every
        ``refresh_interval_s`` (always with ``force``); None when there is nothing newer."""
        if self.latest is None:
            return None
        now = time.monotonic()
        if not force and now - self._last_check < self.refresh_interval_s:
            return None
        self._last_check = now
        found = self.latest()
        if found is None or found[0] <= self.policy_version:
            return None
        return found

    def close(self) -> None:  # noqa: B027 - optional hook, most engines hold nothing
        """Release resources."""


def load_model_state(checkpoint: str | Path) -> dict[str, Any]:
    """The model ``state_dict`` inside a checkpoint file.

    Accepts a learner checkpoint (``{"model": ...}``, or ``{"backend": {"model": ...}}``) or a
    bare model ``state_dict``.
    """
    import torch

    state = torch.load(str(checkpoint), map_location="cpu", weights_only=False)
    if not isinstance(state, dict):
        raise EngineError(f"checkpoint {checkpoint} holds a {type(state).__name__}, expected a dict")
    for key in ("backend", "state"):
        if isinstance(state.get(key), dict):
            state = state[key]
    if isinstance(state.get("model"), dict):
        state = state["model"]
    return state


def check_input(input_ids: Sequence[int]) -> list[int]:
    ids = [int(t) for t in input_ids]
    if not ids:
        raise ValidationError("input_ids must not be empty")
    return ids


class SGLangEngine(Engine):
    """An SGLang server's native ``POST /generate`` with ``input_ids`` and ``return_logprob``.

    Output ids and log-probs come from ``meta_info.output_token_logprobs`` (``[logprob,
    token_id, text]`` per generated token). The serving version is ``meta_info.weight_version``
    when the server reports an integer one, else the version this engine last pushed with
    :meth:`update_weights_from_disk` (or ``policy_version`` given at construction).

    ``latest`` works as for :class:`~sapwood.rollout.torch_engine.LocalTorchEngine`: when a newer version is published,
    :meth:`refresh` asks the server to load its checkpoint (``/update_weights_from_disk``;
    the checkpoint must then be in a format the server can load).
    """

    name = "sglang"

    def __init__(
        self,
        base_url: str,
        *,
        client: httpx.Client | None = None,
        timeout_s: float = 600.0,
        policy_version: int = 0,
        latest: LatestPolicy | None = None,
        refresh_interval_s: float = 1.0,
        extra_request: dict[str, Any] | None = None,
    ) -> None:
        import httpx

        self.base_url = base_url.rstrip("/")
        self._own_client = client is None
        self.client = client or httpx.Client(timeout=timeout_s)
        self._version = policy_version
        self.latest = latest
        self.refresh_interval_s = refresh_interval_s
        self.extra_request = dict(extra_request or {})
        self._last_check = -float("inf")

    @property
    def policy_version(self) -> int:
        return self._version

    def _post(self, path: str, body: dict[str, Any]) -> Any:
        import httpx

        try:
            resp = self.client.post(f"{self.base_url}{path}", json=body)
            resp.raise_for_status()
            return resp.json()
        except httpx.HTTPStatusError as exc:
            raise EngineError(f"SGLang {path} answered HTTP {exc.response.status_code}: "
                              f"{exc.response.text[:500]}") from exc
        except httpx.HTTPError as exc:
            raise EngineError(f"SGLang {path} request failed: {exc}") from exc
        except ValueError as exc:
            raise EngineError(f"SGLang {path} answered something that is not JSON: {exc}") from exc

    def request_body(self, input_ids: Sequence[int], params: SamplingParams) -> dict[str, Any]:
        """The ``/generate`` request for one call."""
        return {
            **self.extra_request,
            "input_ids": check_input(input_ids),
            "sampling_params": params.to_dict(),
            "return_logprob": True,
            "stream": False,
        }

    def generate(self, input_ids: Sequence[int], params: SamplingParams) -> Generation:
        self.refresh()
        t0 = time.perf_counter()
        data = self._post("/generate", self.request_body(input_ids, params))
        if isinstance(data, list):  # a batch answer to a single prompt
            if len(data) != 1:
                raise EngineError(f"expected one generation, got {len(data)}")
            data = data[0]
        return self.parse_response(data, latency_s=time.perf_counter() - t0)

    def parse_response(self, data: Any, *, latency_s: float = 0.0) -> Generation:
        """Map a ``/generate`` response to a :class:`Generation` (ids and log-probs from ``meta_info``)."""
        meta = data.get("meta_info") if isinstance(data, dict) else None
        if not isinstance(meta, dict):
            raise EngineError("SGLang response has no meta_info object")
        triples = meta.get("output_token_logprobs")
        if not isinstance(triples, list) or not triples:
            raise EngineError("SGLang response has no meta_info.output_token_logprobs "
                              "(was return_logprob set? did it generate anything?)")
        ids: list[int] = []
        lps: list[float] = []
        for i, item in enumerate(triples):
            if not isinstance(item, list | tuple) or len(item) < 2 or item[0] is None or item[1] is None:
                raise EngineError(f"output_token_logprobs[{i}] is {item!r}; expected [logprob, token_id, text]")
            lps.append(float(item[0]))
            ids.append(int(item[1]))
        reason = meta.get("finish_reason")
        finish = str(reason.get("type", "unknown")) if isinstance(reason, dict) else str(reason or "unknown")
        version = self._version
        wv = meta.get("weight_version")
        if wv is not None:
            with contextlib.suppress(TypeError, ValueError):
                version = int(wv)
        timings = {"latency_s": latency_s}
        if isinstance(meta.get("e2e_latency"), int | float):
            timings["server_latency_s"] = float(meta["e2e_latency"])
        return Generation(
            output_ids=np.asarray(ids, dtype=np.int32),
            logprobs=np.minimum(np.asarray(lps, dtype=np.float32), 0.0),
            policy_version=version,
            finish_reason=finish,
            timings=timings,
        )

    def update_weights_from_disk(self, checkpoint: str, version: int) -> None:
        """Ask the server to serve ``checkpoint`` as ``version`` (``POST /update_weights_from_disk``)."""
        data = self._post("/update_weights_from_disk", {"model_path": checkpoint, "weight_version": str(version)})
        if isinstance(data, dict) and data.get("success") is False:
            raise EngineError(f"SGLang refused to load {checkpoint}: {data.get('message', '')}")
        self._version = version

    def refresh(self, *, force: bool = False) -> bool:
        found = self._newer_policy(force)
        if found is None:
            return False
        self.update_weights_from_disk(found[1], found[0])
        return True

    def close(self) -> None:
        if self._own_client:
            self.client.close()
