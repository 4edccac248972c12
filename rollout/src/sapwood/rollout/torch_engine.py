"""``LocalTorchEngine``: samples from the learner's ``TinyActorCritic`` on CPU (temperature / top-p).

Between calls it loads the newest published policy version. It is a rollout engine like
:class:`~sapwood.rollout.engines.SGLangEngine`, but not part of the recorder SDK: it imports the
learner's model (and torch), which a worker that only records never loads. The demo's workers and
the elastic runtime's cells (:mod:`sapwood.scheduler.runtime.cell`) serve calls with it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np
import torch

from sapwood.learner.model import KVCache, TinyActorCritic, TinyTransformerConfig
from sapwood.platform.errors import ValidationError
from sapwood.rollout.engines import (
    Engine,
    EngineError,
    Generation,
    LatestPolicy,
    SamplingParams,
    check_input,
    load_model_state,
)

__all__ = ["LocalTorchEngine", "kv_cache_bytes", "sampling_logprobs"]


def kv_cache_bytes(cache: KVCache) -> int:
    """Bytes of a ``KVCache``'s tensors."""
    return sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in cache)


class LocalTorchEngine(Engine):
    """Samples from a ``TinyActorCritic`` on CPU: one prefill of the input, then one incremental
    forward per generated token over the cached past keys/values (``kv_cache=False``: the old full
    recompute of the whole sequence per token, kept as the reference and for the benchmark).

    The log-prob of each token is read from the same computation the learner does
    (``tree_forward`` on a path is a causal forward with positions ``0..n-1``), so with
    temperature 1 and top-p 1 the logged π_rollout equals the learner's π_θ for the same
    weights. ``logprobs="sampling"`` (default) logs the distribution actually sampled from
    (after temperature and top-p); ``"model"`` logs the untempered model distribution.

    ``latest`` (e.g. ``lambda: latest_policy(store, run_id)``) is polled at most every
    ``refresh_interval_s`` before a call; a newer version's checkpoint is loaded then, never
    in the middle of a call. One engine per worker thread.
    """

    name = "local-torch"

    def __init__(
        self,
        config: TinyTransformerConfig,
        *,
        state: dict[str, Any] | None = None,
        policy_version: int = 0,
        latest: LatestPolicy | None = None,
        refresh_interval_s: float = 0.0,
        seed: int = 0,
        logprobs: Literal["sampling", "model"] = "sampling",
        kv_cache: bool = True,
    ) -> None:
        if logprobs not in ("sampling", "model"):
            raise ValidationError(f"logprobs must be 'sampling' or 'model', got {logprobs!r}")
        self.config = config
        self.model: TinyActorCritic = TinyActorCritic(config).eval()
        if state is not None:
            self.model.load_state_dict(state)
        self._version = policy_version
        self.latest = latest
        self.refresh_interval_s = refresh_interval_s
        self.logprob_mode = logprobs
        self.kv_cache = kv_cache
        self.generator = torch.Generator().manual_seed(seed)
        self._last_check = -float("inf")
        self._lock = threading.Lock()
        #: Number of policy switches (weights loads) so far.
        self.loads = 0

    @property
    def policy_version(self) -> int:
        return self._version

    def load(self, state: dict[str, Any], version: int) -> None:
        """Serve ``state`` as policy ``version`` from the next call on."""
        with self._lock:
            self.model.load_state_dict(state)
            self._version = version
            self.loads += 1

    def refresh(self, *, force: bool = False) -> bool:
        found = self._newer_policy(force)
        if found is None:
            return False
        version, checkpoint = found
        try:
            state = load_model_state(checkpoint)
        except FileNotFoundError:  # pruned or not visible yet: keep serving the current version
            return False
        self.load(state, version)
        return True

    def next_token_logits(self, ids: torch.Tensor) -> torch.Tensor:
        """Logits [V] of the token after ``ids`` [n] (actor trunk only, causal mask)."""
        n = int(ids.numel())
        mask = torch.ones(n, n, dtype=torch.bool).tril()
        h = self.model.actor(ids, torch.arange(n), mask)
        logits: torch.Tensor = self.model.lm_head(h[-1])
        return logits

    def extend(self, new_ids: Sequence[int] | torch.Tensor,
               past: KVCache | None = None) -> tuple[torch.Tensor, KVCache]:
        """Feed ``new_ids`` [t ≥ 1] after the tokens ``past`` caches; returns ``(logits [V] of the next
        token, cache of all tokens)``. Call under ``torch.inference_mode()``."""
        ids = torch.as_tensor(new_ids, dtype=torch.int64).reshape(-1)
        if ids.numel() == 0:
            raise EngineError("extend needs at least one new token id")
        logits, cache = self.model.actor_step(ids, past)
        return logits[-1].float(), cache

    def generate(self, input_ids: Sequence[int], params: SamplingParams) -> Generation:
        self.refresh()
        ids = check_input(input_ids)
        limit = self.config.max_position
        if len(ids) + params.max_new_tokens > limit:
            raise EngineError(f"{len(ids)} input + {params.max_new_tokens} new tokens exceed the model's "
                              f"max_position {limit}")
        t0 = time.perf_counter()
        out: list[int] = []
        lps: list[float] = []
        finish = "length"
        stop = set(params.stop_token_ids)
        with self._lock, torch.inference_mode():
            version = self._version
            seq = torch.tensor(ids, dtype=torch.int64)
            past: KVCache | None = None
            pending = seq  # tokens not yet fed to the model
            for _ in range(params.max_new_tokens):
                if self.kv_cache:
                    logits, past = self.extend(pending, past)
                else:
                    logits = self.next_token_logits(seq).float()
                model_logp = torch.log_softmax(logits, dim=-1)
                sample_logp = sampling_logprobs(logits, params.temperature, params.top_p)
                token = int(torch.multinomial(sample_logp.exp(), 1, generator=self.generator))
                lp = sample_logp[token] if self.logprob_mode == "sampling" else model_logp[token]
                out.append(token)
                lps.append(float(lp))
                pending = torch.tensor([token])
                if not self.kv_cache:
                    seq = torch.cat([seq, pending])
                if token in stop:
                    finish = "stop"
                    break
        return Generation(
            output_ids=np.asarray(out, dtype=np.int32),
            logprobs=np.minimum(np.asarray(lps, dtype=np.float32), 0.0),
            policy_version=version,
            finish_reason=finish,
            timings={"latency_s": time.perf_counter() - t0},
        )


def sampling_logprobs(logits: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """Log-probs [V] of the distribution sampled from: softmax(logits / T), restricted to the top-p nucleus."""
    logp = torch.log_softmax(logits / temperature, dim=-1)
    if top_p >= 1.0:
        return logp
    sorted_logp, order = torch.sort(logp, descending=True)
    cum = sorted_logp.exp().cumsum(-1)
    drop_sorted = (cum - sorted_logp.exp()) >= top_p  # keep the smallest prefix reaching top_p
    drop = torch.zeros_like(drop_sorted).scatter(0, order, drop_sorted)
    masked = logp.masked_fill(drop, -float("inf"))
    return torch.log_softmax(masked, dim=-1)
