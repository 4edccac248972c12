"""Demo ablation arms: the task variants say what they claim, and arms keep the caller's settings."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from sapwood.demo.ablations import ABLATIONS, ARMS, SEGMENT_TASK
from sapwood.demo.config import DemoConfig
from sapwood.demo.pretrain import PretrainConfig
from sapwood.demo.tasks import FORK, DemoNoise, KeyRecallEnv, teacher_action, teacher_summary


def test_every_ablation_names_known_arms_and_arms_keep_the_callers_settings() -> None:
    assert all(name in ARMS for arms in ABLATIONS.values() for name in arms)
    base = DemoConfig(executions=7, pretrain=replace(PretrainConfig(), max_clean_steps=3, min_clean_steps=3))
    unit = ARMS["fork task, unit weights"](base)
    path = ARMS["fork task, path weights"](base)
    assert (unit.fork_weighting, path.fork_weighting) == ("unit", "path")
    assert unit.task == path.task
    assert unit.task.policy_forks == 2
    assert unit.task.fork_prob == 0.0
    assert unit.pretrain.noise.fork_action == 0.15
    assert unit.pretrain.max_clean_steps == 3
    assert unit.executions == 7
    seg = ARMS["segment task, segment-mean loss"](base)
    assert seg.aggregation == "segment_mean"
    assert seg.task.context_limit == SEGMENT_TASK.context_limit
    assert ARMS["segment task, token-level loss"](base).aggregation == "token"


def _segments_and_forks(env: KeyRecallEnv, noise: DemoNoise, seed: int) -> tuple[int, int]:
    rng = np.random.default_rng(seed)
    state = env.reset(env.sample_task(rng))
    forks = 0
    while not env.finished(state):
        if env.needs_summary(state):
            env.compact(state, teacher_summary(env, state, noise, rng))
            continue
        action = teacher_action(env, state, noise, rng)
        forks += int(action == FORK)
        env.act(state, [action], rng)
    return state.segment + 1, forks


def test_the_segment_task_gives_executions_of_1_to_5_segments() -> None:
    env = KeyRecallEnv(SEGMENT_TASK)
    clean = DemoNoise(wrong_action=0.0, invalid_action=0.0, summary_substitute=0.0, summary_truncate=0.0)
    counts = [_segments_and_forks(env, clean, s)[0] for s in range(200)]
    assert min(counts) == 1
    assert max(counts) == 5
    assert sum(c == 1 for c in counts) > 10
    assert sum(c >= 4 for c in counts) > 30


def test_the_fork_task_demonstrator_forks_often() -> None:
    cfg = ARMS["fork task, path weights"](DemoConfig())
    env = KeyRecallEnv(cfg.task)
    forks = [_segments_and_forks(env, cfg.pretrain.noise, s)[1] for s in range(200)]
    assert np.mean([f > 0 for f in forks]) > 0.6
    assert max(forks) == 2
