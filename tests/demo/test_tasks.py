"""The key-recall task family: tool, compaction harness, scorer, demonstrator, and that it is not trivial."""

from __future__ import annotations

import numpy as np
import pytest

from sapwood.demo.tasks import (
    BOS,
    CONT,
    FORK,
    INVALID,
    KEY_CLOSE,
    KEY_OPEN,
    MEM_CLOSE,
    MEM_OPEN,
    NONE,
    OK,
    PAD,
    SUM_END,
    SUM_REQ,
    TASK,
    WRONG,
    DemoNoise,
    KeyRecallConfig,
    KeyRecallEnv,
    KeyTask,
    render,
    teacher_action,
    teacher_summary,
)
from sapwood.platform.errors import ValidationError

CLEAN = DemoNoise(wrong_action=0.0, invalid_action=0.0, summary_substitute=0.0, summary_truncate=0.0)


def play_teacher(env: KeyRecallEnv, task: KeyTask, noise: DemoNoise, seed: int = 0) -> tuple[float, bool, int]:
    """Play ``task`` with the demonstrator; returns (score, timed out, compactions)."""
    rng = np.random.default_rng(seed)
    state = env.reset(task)
    while not env.finished(state):
        assert len(state.context) <= env.config.context_limit
        if env.needs_summary(state):
            summary = teacher_summary(env, state, noise, rng)
            assert len(env.summary_input(state)) + len(summary) <= env.config.context_limit
            env.compact(state, summary)
            continue
        env.act(state, [teacher_action(env, state, noise, rng)], rng)
    return env.score(state), env.timed_out(state), state.summaries


def test_prompt_layout_and_tool_observations() -> None:
    env = KeyRecallEnv()
    c = env.config
    task = KeyTask("t", tuple(c.symbol(i) for i in (3, 1, 4, 0, 5, 9)))
    state = env.reset(task)
    assert state.context[:3] == [BOS, TASK, KEY_OPEN]
    assert state.context[3:9] == list(task.key)
    assert state.context[9:-1] == [PAD] * (c.max_key - 6)  # fixed layout
    assert state.context[-1] == KEY_CLOSE
    rng = np.random.default_rng(0)

    obs = env.act(state, [c.symbol(3)], rng)  # right
    assert obs[0] == OK
    assert obs[-1] == c.symbol(3)
    assert len(obs) == c.observation_tokens
    assert all(c.noise_base <= t < c.vocab_size for t in obs[1:-1])
    obs = env.act(state, [c.symbol(7)], rng)  # wrong: the slot is used up, ref names the right symbol
    assert obs[0] == WRONG
    assert obs[-1] == c.symbol(1)
    obs = env.act(state, [SUM_END], rng)  # not a symbol: invalid, no progress
    assert obs[0] == INVALID
    assert obs[-1] == c.symbol(1)
    assert (state.slot, state.correct, state.turns, state.invalid) == (2, 1, 3, 1)
    assert env.score(state) == pytest.approx(1 / 6)


def test_invalid_first_action_has_no_ref() -> None:
    env = KeyRecallEnv()
    state = env.reset(env.sample_task(np.random.default_rng(1)))
    assert env.act(state, [BOS], np.random.default_rng(0))[-1] == NONE


def test_compaction_keeps_only_the_summary() -> None:
    env = KeyRecallEnv()
    c = env.config
    task = env.sample_task(np.random.default_rng(3))
    state = env.reset(task)
    rng = np.random.default_rng(0)
    while not env.needs_summary(state):
        env.act(state, [task.key[state.slot]], rng)
    assert len(state.context) + c.turn_tokens + c.summary_reserve > c.context_limit
    assert env.summary_input(state)[-1] == SUM_REQ
    rest = list(task.key[state.slot :])
    new = env.compact(state, [*rest, SUM_END, c.symbol(0)])  # tokens after SUM_END are dropped
    assert new[:3] == [BOS, CONT, MEM_OPEN]
    assert new[-1] == MEM_CLOSE
    assert new[3 : 3 + len(rest)] == rest
    assert not set(task.key[: len(task.key) - len(rest)]) & set(new)  # emitted symbols are gone
    assert state.segment == 1
    assert state.cursor == 0
    assert state.visible == rest


def test_clean_demonstrator_solves_every_key_within_budget_from_its_context_only() -> None:
    env = KeyRecallEnv()
    c = env.config
    for k in range(c.min_key, c.max_key + 1):
        task = KeyTask(f"k{k}", tuple(c.symbol(i) for i in range(k)))
        score, timed_out, compactions = play_teacher(env, task, CLEAN)
        if k <= c.max_turns:
            assert (score, timed_out) == (1.0, False)
        else:  # longer keys always run out of turns: graded by partial progress
            assert timed_out
            assert score == pytest.approx(c.max_turns / k)
        assert compactions >= (1 if k > 6 else 0)


def test_summary_decides_what_later_segments_can_see() -> None:
    env = KeyRecallEnv()
    task = KeyTask("k14", tuple(env.config.symbol(i) for i in range(12)))
    truncating = DemoNoise(wrong_action=0.0, invalid_action=0.0, summary_substitute=0.0, summary_truncate=1.0)
    scores = [play_teacher(env, task, truncating, seed=s)[0] for s in range(20)]
    assert max(scores) < 1.0  # a summary that drops symbols leaves later actions guessing
    assert play_teacher(env, task, CLEAN)[0] == 1.0


def test_untrained_policy_does_not_solve_the_task() -> None:
    """A random-init policy emits mostly invalid tokens: reward near 0 (room for learning)."""
    import torch

    from sapwood.demo.worker import run_execution
    from sapwood.learner.model import TinyTransformerConfig
    from sapwood.rollout.recorder import Recorder
    from sapwood.rollout.torch_engine import LocalTorchEngine
    from sapwood.rollout.transports import MemoryTransport

    env = KeyRecallEnv()
    cfg = TinyTransformerConfig(vocab_size=env.config.vocab_size, d_model=64, n_heads=4, n_layers=2, d_ff=128,
                                max_position=env.config.context_limit)
    torch.manual_seed(0)
    from sapwood.learner.model import TinyActorCritic

    engine = LocalTorchEngine(cfg, state=TinyActorCritic(cfg).state_dict(), seed=0)
    recorder = Recorder(MemoryTransport(), run_id="untrained", vocab_size=cfg.vocab_size)
    rng = np.random.default_rng(0)
    reports = [run_execution(env, engine, recorder, env.sample_task(rng), rng) for _ in range(12)]
    assert float(np.mean([r.reward for r in reports])) < 0.15
    assert sum(r.status == "timeout" for r in reports) >= 10


def test_config_is_validated() -> None:
    with pytest.raises(ValidationError, match="context_limit"):
        KeyRecallConfig(context_limit=24)
    with pytest.raises(ValidationError, match="min_key"):
        KeyRecallConfig(max_key=20)


def test_render_names_every_token() -> None:
    c = KeyRecallConfig()
    assert render([BOS, c.symbol(3), c.noise_base + 1, OK, 999], c) == "BOS s3 ~1 OK ?999"


def test_fork_is_an_action_only_where_the_task_allows_it() -> None:
    rng = np.random.default_rng(0)
    plain = KeyRecallEnv()
    state = plain.reset(plain.sample_task(rng))
    assert plain.act(state, [FORK], rng)[0] == INVALID
    assert state.forks == 0
    env = KeyRecallEnv(KeyRecallConfig(policy_forks=1))
    state = env.reset(env.sample_task(rng))
    obs = env.act(state, [FORK], rng)
    assert obs[0] == FORK
    assert obs[-1] == NONE  # nothing graded yet
    assert (state.turns, state.slot, state.forks, state.invalid) == (1, 0, 1, 0)  # a turn used, no slot
    assert env.act(state, [FORK], rng)[0] == INVALID  # no forks left on this trajectory
    assert not env.can_fork(state)


def test_the_demonstrator_forks_at_its_fork_rate() -> None:
    env = KeyRecallEnv(KeyRecallConfig(policy_forks=2))
    rng = np.random.default_rng(1)
    state = env.reset(env.sample_task(rng))
    always = DemoNoise(wrong_action=0.0, invalid_action=0.0, fork_action=1.0)
    actions = []
    for _ in range(3):
        actions.append(teacher_action(env, state, always, rng))
        env.act(state, [actions[-1]], rng)
    assert actions[:2] == [FORK, FORK]
    assert actions[2] == state.task.key[0]
    never = KeyRecallEnv(KeyRecallConfig(policy_forks=0))
    s2 = never.reset(state.task)
    assert teacher_action(never, s2, always, rng) != FORK
