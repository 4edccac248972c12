"""Helpers of the Megatron-core backend tests, and the rank function run in spawned processes.

Spawned ranks import this module by name (``tests.support.megatron_ranks``:
the repository root is on ``sys.path``, which spawn passes on).
"""

from __future__ import annotations

import os
import warnings
from datetime import timedelta
from pathlib import Path

import torch

from sapwood.learner.advantages import batch_gae
from sapwood.learner.batch import TreeBatch
from sapwood.learner.config import CriticConfig, LearnerConfig, OptimConfig
from sapwood.learner.model import TinyActorCritic, TinyTransformerConfig, tree_forward
from sapwood.learner.trainer import LossTargets, compute_losses
from tests.support.random_trees import random_tree_batch

VOCAB = 32


def require_megatron() -> None:
    """Skip without megatron-core, except under CI (``CI`` set), where the ``megatron`` extra is installed
    and its absence must fail the run."""
    import pytest

    if os.environ.get("CI"):
        import megatron.core  # noqa: F401 - an ImportError here fails the test, as it should in CI
    else:
        pytest.importorskip("megatron.core", reason="the megatron extra is not installed")


def model_config(shared: bool = False) -> TinyTransformerConfig:
    return TinyTransformerConfig(vocab_size=VOCAB, d_model=32, n_heads=4, n_layers=2, d_ff=64, shared_trunk=shared)


def tiny_model(seed: int, shared: bool = False, dtype: torch.dtype = torch.float64) -> TinyActorCritic:
    torch.manual_seed(seed)
    return TinyActorCritic(model_config(shared)).to(dtype)


def near_policy_batch(model: TinyActorCritic, seed: int, num_executions: int = 3) -> TreeBatch:
    """Random tree whose rollout log-probs are the model's plus noise (some DIS ratios in, some out)."""
    batch = random_tree_batch(seed, num_executions=num_executions, jmax=4, max_segments=3, vocab_size=VOCAB)
    with torch.no_grad():
        lp = tree_forward(model, batch).logprob.float()
    noise = 0.6 * torch.randn(batch.num_tokens, generator=torch.Generator().manual_seed(seed))
    batch.rollout_logprob = torch.where(batch.trainable, (lp + noise).clamp(max=0.0), 0.0)
    batch.validate()
    return batch


def parallel_config(aggregation: str = "token") -> LearnerConfig:
    """Warm-up then joint steps; catch-up only on the (exactly reduced) value-loss criterion."""
    from sapwood.learner.config import PolicyLossConfig

    return LearnerConfig(
        policy=PolicyLossConfig(aggregation=aggregation),  # type: ignore[arg-type]
        critic=CriticConfig(warmup_steps=1, catchup_max_steps=1, catchup_min_explained_var=None),
        optim=OptimConfig(actor_lr=3e-3, critic_lr=3e-3, actor_grad_clip=0.5),
    )


STEPS = 3
EXECUTIONS = 4


def first_batch(tiny: TinyActorCritic, cfg: LearnerConfig, seed: int) -> tuple[TreeBatch, LossTargets]:
    """The first training batch and its loss targets from the tiny model (bitwise the same on every rank)."""
    batch = near_policy_batch(tiny, seed * 100, num_executions=EXECUTIONS)
    with torch.no_grad():
        old = tree_forward(tiny, batch)
    return batch, LossTargets.build(batch, batch_gae(batch, old.values, cfg.advantage), old, cfg.policy)


def reference_gradients(seed: int, aggregation: str) -> tuple[dict[str, torch.Tensor], float]:
    """Gradients and loss of the tiny torch model on the whole first batch."""
    tiny = tiny_model(seed)
    cfg = parallel_config(aggregation)
    batch, targets = first_batch(tiny, cfg, seed)
    loss, _ = compute_losses(tree_forward(tiny, batch), targets, cfg)
    loss.backward()
    return {k: p.grad if p.grad is not None else torch.zeros_like(p) for k, p in tiny.named_parameters()}, float(loss)


def run_steps(rank: int, world: int, mode: str, aggregation: str, seed: int) -> dict[str, object]:
    """Gradients on the first batch, then ``STEPS`` SAO steps of a float64 ``MegatronBackend``.

    ``mode``: ``"dp"`` (rank r trains executions r, r + world, ...), ``"tp"`` (every rank the whole
    batch, the model sharded), ``"single"`` (one rank, whole batch) or ``"alone"`` (rank 0 of a larger
    world trains the whole batch with ``data_parallel=False``, as the core cell's replica does). Returns the
    full first-batch gradients and loss, the final weights in ``TinyActorCritic`` layout and the metrics of
    every step.
    """
    from sapwood.learner.megatron_backend import MegatronBackend
    from sapwood.learner.shard import shard_by_execution
    from sapwood.learner.trainer import SAOTrainer

    tiny = tiny_model(seed)
    cfg = parallel_config(aggregation)
    backend = MegatronBackend.from_config(model_config(), cfg, dtype=torch.float64, init_state=tiny.state_dict(),
                                          tensor_parallel=2 if mode == "tp" else 1, data_parallel=mode != "alone")
    batch, targets = first_batch(tiny, cfg, seed)
    local = batch
    if mode == "dp":
        local = shard_by_execution(batch, rank, world)
        index = torch.isin(batch.execution, torch.arange(rank, batch.num_executions, world)).nonzero().squeeze(1)
        targets = targets.select(index, batch.token_weight()[index].double())  # the tokens' path weights
    grads, metrics = backend.gradients(local, lambda out: compute_losses(out, targets, cfg))

    trainer = SAOTrainer(backend, cfg)
    history = []
    for step in range(STEPS):
        batch = near_policy_batch(tiny, seed * 100 + step, num_executions=EXECUTIONS)
        local = shard_by_execution(batch, rank, world) if mode == "dp" else batch
        assert bool(local.trainable.any()), "every data-parallel rank needs trainable tokens"
        history.append(trainer.train_step(local))
    return {"grads": grads, "grad_loss": metrics["train/loss"], "state": backend.tiny_state_dict(),
            "history": history}


def rank_main(rank: int, world: int, port: int, mode: str, aggregation: str, seed: int, out: str) -> None:
    """Entry point of a spawned rank: start the gloo world, run ``run_steps``, rank 0 saves the result."""
    import torch.distributed as dist

    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    # a bounded timeout: a collective that waits for a rank that never joins it fails instead of hanging
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=120))
    try:
        from sapwood.learner.megatron_parallel import layout, teardown_parallel

        if mode == "alone" and rank:  # a rank that is not the replica's data-parallel peer: it only waits
            from sapwood.learner.megatron_parallel import init_parallel

            init_parallel(1)  # megatron's groups are created by every rank of the world
            result: dict[str, object] = {}
        else:
            result = run_steps(rank, world, mode, aggregation, seed)
        dist.barrier()
        where = layout()
        if rank == 0:
            torch.save({**result, "layout": where}, Path(out))
        teardown_parallel()
    finally:
        dist.destroy_process_group()
