"""The phases around the asynchronous one: policy version 0 (pre-trained, cached per process), the fixed
evaluation tasks of a seed, and their evaluation with a fixed engine."""

from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import asdict, replace

import numpy as np
import torch

from sapwood.demo.config import DemoConfig, ProgressHook
from sapwood.demo.pretrain import PretrainResult, pretrain
from sapwood.demo.tasks import KeyRecallEnv, KeyTask
from sapwood.demo.worker import ExecutionReport, run_execution
from sapwood.learner.model import TinyActorCritic
from sapwood.rollout.recorder import Recorder
from sapwood.rollout.torch_engine import LocalTorchEngine

__all__ = ["EVAL_STREAM", "eval_tasks", "evaluate", "pretrained_policy"]

_PRETRAINED: dict[str, tuple[dict[str, torch.Tensor], PretrainResult]] = {}
_PRETRAINED_LOCK = threading.Lock()


def _pretrain_key(cfg: DemoConfig) -> str:
    blob = json.dumps([asdict(cfg.model_config()), asdict(cfg.task), asdict(cfg.pretrain), cfg.seed],
                      sort_keys=True, default=str)
    return hashlib.blake2b(blob.encode(), digest_size=12).hexdigest()


def pretrained_policy(cfg: DemoConfig, hook: ProgressHook | None = None) -> tuple[dict[str, torch.Tensor],
                                                                                 PretrainResult, bool]:
    """Policy version 0: a ``TinyActorCritic`` state after brief supervised pre-training.

    Cached per process by configuration and seed (ablation arms share it). Returns
    ``(state_dict, result, cached)``.
    """
    key = _pretrain_key(cfg)
    with _PRETRAINED_LOCK:
        if key in _PRETRAINED:
            state, result = _PRETRAINED[key]
            return {k: v.clone() for k, v in state.items()}, result, True
        torch.manual_seed(cfg.seed)
        model = TinyActorCritic(cfg.model_config())
        def on_step(step: int, loss: float, planned: int) -> None:
            if hook is not None:
                hook("pretrain", step + 1, planned, {"loss": loss})

        result = pretrain(model, KeyRecallEnv(cfg.task), replace(cfg.pretrain, seed=cfg.seed), on_step=on_step)
        state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        _PRETRAINED[key] = (state, result)
        return {k: v.clone() for k, v in state.items()}, result, False


def eval_tasks(cfg: DemoConfig) -> list[KeyTask]:
    """The fixed evaluation tasks of a seed."""
    env = KeyRecallEnv(cfg.task)
    rng = np.random.default_rng([cfg.seed, 7919])
    return [env.sample_task(rng, task_id=f"eval-{i}") for i in range(cfg.eval_executions)]


EVAL_STREAM = 104729
"""The random stream of the evaluations (:func:`evaluate`'s default)."""


def evaluate(cfg: DemoConfig, engine: LocalTorchEngine, recorder: Recorder, tasks: list[KeyTask], phase: str,
             hook: ProgressHook | None = None, summary_engine: LocalTorchEngine | None = None, *,
             stream: int = EVAL_STREAM) -> list[ExecutionReport]:
    """Play ``tasks`` once each with a fixed engine (same sampling seeds at start and end). ``stream`` names
    the random streams of the environment and the sampling: another stream plays with seeds of its own (the
    critic warm-up's rollouts, :mod:`sapwood.demo.critic_warmup`)."""
    env = KeyRecallEnv(cfg.task)
    out = []
    for i, task in enumerate(tasks):
        rng = np.random.default_rng([cfg.seed, stream, i])
        offset = 0 if stream == EVAL_STREAM else stream * 1_000_000_007
        engine.generator.manual_seed(cfg.seed * 1_000_003 + i + offset)
        if summary_engine is not None:
            summary_engine.generator.manual_seed(cfg.seed * 1_000_033 + i + offset)
        out.append(run_execution(env, engine, recorder, task, rng, temperature=cfg.temperature, top_p=cfg.top_p,
                                 fork=False, run_metadata={"phase": phase}, summary_engine=summary_engine))
        if hook is not None:
            hook(phase, i + 1, len(tasks), {"reward": float(np.mean([r.reward for r in out]))})
    return out
