"""Engine → recorder → store → batch source → learner, on the demo's key-recall task."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from sapwood.demo.tasks import KeyRecallEnv
from sapwood.demo.worker import run_execution
from sapwood.learner.assembly import build_batch
from sapwood.learner.config import SourceConfig
from sapwood.learner.model import TinyActorCritic, TinyTransformerConfig, tree_forward
from sapwood.platform.store import Store
from sapwood.rollout.recorder import Recorder
from sapwood.rollout.torch_engine import LocalTorchEngine
from sapwood.rollout.transports import InProcessTransport

CFG = TinyTransformerConfig(vocab_size=64, d_model=32, n_heads=4, n_layers=2, d_ff=64, max_position=64)


@pytest.fixture
def model() -> TinyActorCritic:
    torch.manual_seed(0)
    return TinyActorCritic(CFG).eval()


def test_local_engine_logprobs_survive_the_store_and_match_the_learner(tmp_path: Path,
                                                                      model: TinyActorCritic) -> None:
    """Engine → recorder → store → batch source → tree_forward: the logged π_rollout equals π_θ."""
    from sapwood.demo.tasks import KeyRecallConfig

    env = KeyRecallEnv(KeyRecallConfig(fork_prob=1.0))
    cfg = TinyTransformerConfig(vocab_size=env.config.vocab_size, d_model=32, n_heads=4, n_layers=2, d_ff=64,
                                max_position=env.config.context_limit)
    torch.manual_seed(1)
    net = TinyActorCritic(cfg).eval()
    store = Store.open(f"sqlite:///{tmp_path / 's.db'}")
    recorder = Recorder(InProcessTransport(store), run_id="r", vocab_size=cfg.vocab_size)
    engine = LocalTorchEngine(cfg, state=net.state_dict(), seed=0)
    rng = np.random.default_rng(0)
    ids = [run_execution(env, engine, recorder, env.sample_task(rng), rng).execution_id for _ in range(2)]
    recorder.flush()
    batch, used = build_batch(store, ids, SourceConfig())
    assert used == ids
    with torch.no_grad():
        out = tree_forward(net, batch)
    m = batch.trainable
    assert int(m.sum()) > 20
    torch.testing.assert_close(out.logprob[m], batch.rollout_logprob[m], atol=1e-5, rtol=1e-5)
