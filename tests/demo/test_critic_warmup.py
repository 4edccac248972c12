"""The critic warm-up from replayed history: the critic moves, the policy does not, one step per batch."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from sapwood.demo.config import DemoConfig
from sapwood.demo.critic_warmup import warm_critic_from_replay
from sapwood.learner.model import TinyActorCritic
from sapwood.platform import runs
from sapwood.platform.storage.dialects import embedded_url
from sapwood.platform.store import Store


def _model_and_state(cfg: DemoConfig) -> tuple[TinyActorCritic, dict[str, torch.Tensor]]:
    torch.manual_seed(0)
    model = TinyActorCritic(cfg.model_config())
    return model, {k: v.detach().clone() for k, v in model.state_dict().items()}


def _names(model: TinyActorCritic, params: list[torch.nn.Parameter]) -> set[str]:
    ids = {id(p) for p in params}
    return {name for name, p in model.named_parameters() if id(p) in ids}


@pytest.mark.parametrize(("executions", "batch_size", "steps"), [(4, 4, 1), (5, 4, 2)])
def test_the_critic_moves_and_the_policy_stays(tmp_path: Path, executions: int, batch_size: int, steps: int) -> None:
    cfg = DemoConfig(seed=3)
    model, state = _model_and_state(cfg)
    warmed, done = warm_critic_from_replay(cfg, state, executions, batch_size, tmp_path)
    assert done.executions == executions
    assert done.steps == steps  # one critic step per claimed batch, the last one partial
    assert done.value_loss_first is not None
    assert done.value_loss_last is not None
    assert set(warmed) == set(state)
    actor, critic = _names(model, model.actor_parameters()), _names(model, model.critic_parameters())
    assert actor
    assert critic
    for name in actor:
        assert torch.equal(warmed[name], state[name]), f"the policy's {name} moved"
    assert any(not torch.equal(warmed[name], state[name]) for name in critic), "no critic parameter moved"
    assert _replayed(tmp_path, done.replay_run)["done"] == executions  # each trained once, none left claimed


def _replayed(out_dir: Path, replay_run: str | None) -> dict[str, int]:
    assert replay_run is not None
    store = Store.open(embedded_url(out_dir / "critic-warmup.db"))
    try:
        with store.transaction() as conn:
            return runs.run_progress(conn, replay_run)
    finally:
        store.close()


def test_a_second_warm_up_into_the_same_folder_replays_its_own_executions(tmp_path: Path) -> None:
    """A demo re-run into the same ``--out-dir`` warms its critic again: it neither fails on the first run's ids
    nor replays the first run's executions with its own."""
    cfg = DemoConfig(seed=3)
    _, state = _model_and_state(cfg)
    _, first = warm_critic_from_replay(cfg, state, 4, 4, tmp_path)
    _, second = warm_critic_from_replay(cfg, state, 4, 4, tmp_path)
    assert first.replay_run != second.replay_run
    assert second.steps == 1, "4 executions, batches of 4: one step, not two over both runs' executions"
    for done in (first, second):
        progress = _replayed(tmp_path, done.replay_run)
        assert progress["done"] == 4, progress


def test_no_executions_is_no_warm_up(tmp_path: Path) -> None:
    cfg = DemoConfig(seed=3)
    _, state = _model_and_state(cfg)
    warmed, done = warm_critic_from_replay(cfg, state, 0, 8, tmp_path)
    assert (done.steps, done.value_loss_first, done.value_loss_last) == (0, None, None)
    assert all(torch.equal(warmed[k], v) for k, v in state.items())
    assert not (tmp_path / "critic-warmup.db").exists()


@pytest.mark.parametrize(("executions", "batch_size"), [(-1, 8), (8, 0)])
def test_a_warm_up_out_of_range_is_refused(tmp_path: Path, executions: int, batch_size: int) -> None:
    cfg = DemoConfig(seed=3)
    _, state = _model_and_state(cfg)
    with pytest.raises(ValueError, match="executions ≥ 0 and batch_size ≥ 1"):
        warm_critic_from_replay(cfg, state, executions, batch_size, tmp_path)
