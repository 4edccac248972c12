"""Megatron-core backend on the CPU: same numbers as ``TorchBackend`` for the same weights, tree and flat."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from sapwood.learner.advantages import batch_gae
from sapwood.learner.config import CriticConfig, LearnerConfig, OptimConfig, PolicyLossConfig
from sapwood.learner.errors import ConfigError
from sapwood.learner.flat import flatten
from sapwood.learner.megatron_backend import MegatronBackend, loss_denominator
from sapwood.learner.megatron_model import tiny_to_megatron, weight_map
from sapwood.learner.megatron_parallel import init_parallel, layout, teardown_parallel
from sapwood.learner.model import TinyActorCritic, TinyTransformerConfig, TorchBackend, flat_forward, tree_forward
from sapwood.learner.trainer import LossTargets, SAOTrainer, compute_losses
from tests.support.megatron_ranks import VOCAB, model_config, near_policy_batch, require_megatron
from tests.support.random_trees import random_tree_batch

require_megatron()
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning")  # megatron's CPU notes


@pytest.fixture(scope="module", autouse=True)
def one_rank() -> Iterator[None]:
    init_parallel(1)
    yield
    teardown_parallel()


def pair(seed: int = 0, shared: bool = False, dtype: torch.dtype = torch.float64,
         optim: OptimConfig | None = None) -> tuple[TorchBackend, MegatronBackend]:
    """A ``TorchBackend`` and a ``MegatronBackend`` holding the same weights."""
    torch.manual_seed(seed)
    tiny = TinyActorCritic(model_config(shared)).to(dtype)
    mega = MegatronBackend(model_config(shared), optim, dtype=dtype, init_state=tiny.state_dict())
    return TorchBackend(tiny, optim), mega


def tiny_grads_in_megatron_layout(tiny: TinyActorCritic, cfg: TinyTransformerConfig) -> dict[str, torch.Tensor]:
    """The tiny model's gradients mapped like its weights (the mapping is a permutation, so grads map alike)."""
    grads = {k: (p.grad if p.grad is not None else torch.zeros_like(p)) for k, p in tiny.named_parameters()}
    return tiny_to_megatron(grads, cfg)


def megatron_grads(backend: MegatronBackend) -> dict[str, torch.Tensor]:
    return {k: (p.grad.clone() if p.grad is not None else torch.zeros_like(p))
            for k, p in backend.model.named_parameters()}


@pytest.mark.parametrize("shared", [False, True])
def test_forward_equals_torch_backend_and_mapping_round_trips(shared: bool) -> None:
    torch_b, mega = pair(shared=shared)
    batch = random_tree_batch(3, jmax=4, vocab_size=VOCAB)
    a, b = torch_b.forward(batch), mega.forward(batch)
    for x, y in ((a.logprob, b.logprob), (a.values, b.values), (a.entropy, b.entropy)):
        assert torch.allclose(x, y, atol=1e-12)
    assert bool((b.logprob[batch.parent >= 0] < 0).all())
    back = mega.tiny_state_dict()
    assert list(back) == list(torch_b.model.state_dict()), "the same keys in the same order (flat transfers rely on it)"
    assert all(torch.equal(back[k], v) for k, v in torch_b.model.state_dict().items())
    # every megatron parameter is covered by the mapping exactly once
    assert sorted(m for _, m, _ in weight_map(model_config(shared))) == sorted(k for k, _ in
                                                                               mega.model.named_parameters())


def test_qkv_layout_matters() -> None:
    """Loading the tiny QKV rows without megatron's per-head interleave changes the outputs."""
    torch_b, mega = pair()
    batch = random_tree_batch(4, jmax=4, vocab_size=VOCAB)
    good = mega.forward(batch).logprob
    with torch.no_grad():
        for name, p in mega.model.named_parameters():
            if name.endswith("layers.0.self_attention.linear_qkv.weight"):
                p.copy_(torch_b.model.state_dict()["actor.blocks.0.qkv.weight"])
    assert not torch.allclose(good, mega.forward(batch).logprob, atol=1e-6)


@pytest.mark.parametrize("shared", [False, True])
@pytest.mark.parametrize(("kind", "aggregation"), [("dis", "token"), ("dis", "segment_mean"), ("ppo", "token")])
def test_loss_and_every_gradient_equal_torch_backend_tree_and_flat(shared: bool, kind: str, aggregation: str) -> None:
    torch_b, mega = pair(seed=1, shared=shared)
    tiny, cfg_m = torch_b.model, model_config(shared)
    batch = near_policy_batch(tiny, 1)
    cfg = LearnerConfig(policy=PolicyLossConfig(kind=kind, aggregation=aggregation))  # type: ignore[arg-type]
    old = torch_b.forward(batch)
    targets = LossTargets.build(batch, batch_gae(batch, old.values, cfg.advantage), old, cfg.policy)

    tiny.zero_grad()
    ref_loss, ref_metrics = compute_losses(tree_forward(tiny, batch), targets, cfg)
    ref_loss.backward()
    ref = tiny_grads_in_megatron_layout(tiny, cfg_m)

    mega.model.zero_grad()
    tree_loss, tree_metrics = compute_losses(tree_forward(mega.model, batch), targets, cfg)
    tree_loss.backward()
    tree = megatron_grads(mega)

    flat = flatten(batch)
    mega.model.zero_grad()
    flat_out = flat_forward(mega.model, batch, flat)
    flat_loss, _ = compute_losses(flat_out, targets.select(flat.cat_index(), flat.cat_weight().double()), cfg)
    flat_loss.backward()
    flat_g = megatron_grads(mega)

    assert torch.allclose(tree_loss, ref_loss, atol=1e-12)
    assert torch.allclose(flat_loss, ref_loss, atol=1e-10)
    assert ref.keys() == tree.keys() == flat_g.keys()
    for name in ref:
        assert torch.allclose(tree[name], ref[name], atol=1e-11), name
        assert torch.allclose(flat_g[name], ref[name], atol=1e-9), name
    assert sum(float(g.abs().sum()) for g in ref.values()) > 0
    if kind == "dis":
        assert 0.0 < tree_metrics["policy/masked_frac"] < 1.0
    assert float(tree_metrics["policy/ratio_mean"]) == pytest.approx(float(ref_metrics["policy/ratio_mean"]), abs=1e-10)
    assert flat_loss.grad_fn is not None
    assert flat.cat_index().numel() > batch.num_tokens


@pytest.mark.parametrize("shared", [False, True])
def test_trainer_steps_match_torch_backend(shared: bool) -> None:
    """Warm-up, joint steps, clipping and both AdamWs: the weights stay equal step after step."""
    optim = OptimConfig(actor_lr=3e-3, critic_lr=3e-3, actor_grad_clip=0.5)
    torch_b, mega = pair(seed=2, shared=shared, optim=optim)
    cfg = LearnerConfig(critic=CriticConfig(warmup_steps=1, catchup_max_steps=1), optim=optim)
    t_tr, m_tr = SAOTrainer(torch_b, cfg), SAOTrainer(mega, cfg)
    for step in range(3):
        batch = near_policy_batch(torch_b.model, 10 + step)
        a, b = t_tr.train_step(batch), m_tr.train_step(batch)
        assert a.keys() == b.keys()
        for k in ("train/loss", "critic/value_loss", "critic/grad_norm", "train/catchup_steps"):
            assert a[k] == pytest.approx(b[k], rel=1e-7, abs=1e-12), k
    assert torch_b.policy_version == mega.policy_version == 2
    want = torch_b.model.state_dict()
    got = mega.tiny_state_dict()
    moved = sum(float((want[k] - v).abs().sum()) for k, v in pair(seed=2, shared=shared)[0].model.state_dict().items())
    assert moved > 0
    for k, v in want.items():
        assert torch.allclose(got[k], v, atol=1e-10), k


def test_only_selected_groups_move_and_version_counts() -> None:
    _, mega = pair(dtype=torch.float32, optim=OptimConfig(actor_lr=1e-3, critic_lr=1e-3))
    batch = near_policy_batch(TinyActorCritic(model_config()), 0)
    cfg = LearnerConfig()
    old = mega.forward(batch)
    targets = LossTargets.build(batch, batch_gae(batch, old.values, cfg.advantage), old, cfg.policy)
    actor0 = [p.detach().clone() for p in mega.model.actor_parameters()]
    critic0 = [p.detach().clone() for p in mega.model.critic_parameters()]
    m = mega.step(batch, lambda o: compute_losses(o, targets, cfg, policy=False), update_actor=False,
                  update_critic=True)
    assert all(torch.equal(a, p) for a, p in zip(actor0, mega.model.actor_parameters(), strict=True))
    assert not all(torch.equal(a, p) for a, p in zip(critic0, mega.model.critic_parameters(), strict=True))
    assert mega.policy_version == 0
    assert m["critic/grad_norm"] > 0
    assert "actor/grad_norm" not in m
    mega.step(batch, lambda o: compute_losses(o, targets, cfg), update_actor=True, update_critic=True)
    assert mega.policy_version == 1
    assert not all(torch.equal(a, p) for a, p in zip(actor0, mega.model.actor_parameters(), strict=True))


def test_checkpoint_round_trip_and_torch_checkpoint_interchange(tmp_path: Path) -> None:
    from sapwood.rollout.engines import load_model_state

    torch_b, mega = pair(dtype=torch.float32, optim=OptimConfig(actor_lr=1e-3, critic_lr=1e-3))
    batch = near_policy_batch(torch_b.model, 5)
    trainer = SAOTrainer(mega, LearnerConfig(critic=CriticConfig(warmup_steps=0)))
    trainer.train_step(batch)
    path = tmp_path / "policy.pt"
    torch.save(mega.state_dict(), path)
    state = torch.load(path, weights_only=False)
    assert state["policy_version"] == 1

    again = MegatronBackend(model_config(), dtype=torch.float32, seed=99)
    again.load_state_dict(state)
    assert again.policy_version == 1
    assert again.actor_opt.state_dict()["state"]  # AdamW moments restored
    assert torch.allclose(again.forward(batch).logprob, mega.forward(batch).logprob, atol=0)
    # the rollout engine and TorchBackend read the same file (TinyActorCritic layout under "model")
    tiny = TinyActorCritic(model_config())
    tiny.load_state_dict(load_model_state(path))
    assert torch.allclose(tree_forward(tiny, batch).logprob, mega.forward(batch).logprob, atol=1e-5)
    # and a TorchBackend checkpoint loads into the megatron backend (weights + version)
    other = MegatronBackend(model_config(), dtype=torch.float32, seed=7)
    other.load_state_dict(torch_b.state_dict() | {"policy_version": 4})
    assert other.policy_version == 4
    assert torch.allclose(other.forward(batch).values, torch_b.forward(batch).values, atol=1e-5)


def test_parallel_state_is_idempotent_and_checked() -> None:
    before = layout()
    assert init_parallel(1) == before
    assert before.world_size == 1
    assert before.data_parallel == 1
    with pytest.raises(ConfigError, match="asked for 2"):
        init_parallel(2)
    with pytest.raises(ConfigError, match=">= 1"):
        init_parallel(0)


def test_bad_inputs_are_refused() -> None:
    _, mega = pair(dtype=torch.float32)
    with pytest.raises(ConfigError, match="max_position"):
        mega.model(torch.zeros(1, dtype=torch.int64), torch.tensor([4096]), torch.ones(1, 1, dtype=torch.bool))
    with pytest.raises(ConfigError, match="lacks"):
        mega.load_tiny_state({"actor.tok.weight": torch.zeros(VOCAB, 32)})
    with pytest.raises(ConfigError, match="aggregation"):
        MegatronBackend(model_config(), aggregation="mean")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="must divide"):
        from sapwood.learner.megatron_model import transformer_config

        transformer_config(replace(model_config(), vocab_size=33), dtype=torch.float32, tensor_parallel=2)


def test_loss_denominator_counts_tokens_and_segments() -> None:
    batch = random_tree_batch(6, jmax=4, max_segments=3, vocab_size=VOCAB)
    weights = [float(w) for w, t in zip(batch.token_weight(), batch.trainable, strict=True) if t]
    assert loss_denominator(batch, "token") == pytest.approx(sum(weights), rel=1e-12)  # |M| = Σ path weights
    assert loss_denominator(batch, "token", "unit") == float(batch.trainable.sum())
    assert min(weights) < 1.0  # the batch forks, so the two rules differ
    segments = loss_denominator(batch, "segment_mean")
    assert 1 <= segments < float(batch.trainable.sum())
    assert segments == len({int(s) for s, t in zip(batch.segment_start(), batch.trainable, strict=True) if t})


def test_the_package_imports_without_megatron_and_says_what_to_install() -> None:
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['megatron'] = None\n"  # makes `import megatron...` raise ImportError
        "import sapwood.learner, sapwood.learner.backends, sapwood.learner.megatron_backend as mb\n"
        "from sapwood.learner.errors import ConfigError\n"
        "from sapwood.learner.model import TinyTransformerConfig\n"
        "try:\n"
        "    mb.MegatronBackend(TinyTransformerConfig(vocab_size=8, d_model=8, n_heads=2, d_ff=8))\n"
        "except ConfigError as exc:\n"
        "    print('refused:', exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "refused: the megatron backend needs megatron-core" in out.stdout
