"""Learner benchmark: does the learner wait on data, and what does training on the tree save?

Part 1 — data wait. Fork-heavy executions are loaded into a store (embedded SQLite by
default), a live run is created, and a learner with background prefetch trains on it. For
every step after the first it records the time spent waiting for the next batch and the
step time; it reports batch assembly tokens/s and the wait share (target ≤ 5 % of a step).

Part 2 — tree vs flattened. One fork-heavy batch (a long shared prefix continued many ways)
is trained with one forward/backward pass over its unique tokens (tree attention mask) and
with the flattened per-trajectory computation; it reports the dedup ratio (flattened tokens
÷ unique tokens) and the speed-up (target ≥ 0.7 × dedup ratio).

Part 3 — token weights. On batches like part 1's, the cost of the path-probability weights
per step: computing them (pointer doubling over the logical tree) against the whole training
step, and whole steps with path weights against unit weights (interleaved).

    python bench/bench_learner.py

Part 4 (``--backend megatron``) — the same fork-heavy batch trained by a full ``backend.step``
(SAO losses, backward, clipping, both AdamWs) on megatron-core and on ``TorchBackend`` with the same
weights, interleaved; part 1 and part 2 then run on the megatron backend too.

    python bench/bench_learner.py --backend megatron

The last stdout line is a JSON object of the figures.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from rich.console import Console
from rich.progress import track

from sapwood.learner.assembly import build_batch
from sapwood.learner.backends import BACKENDS, create_backend
from sapwood.learner.batch import TreeBatch
from sapwood.learner.config import CriticConfig, LearnerConfig, PolicyLossConfig, SourceConfig
from sapwood.learner.flat import flatten
from sapwood.learner.loop import Learner
from sapwood.learner.model import (
    PolicyBackend,
    TinyActorCritic,
    TinyTransformerConfig,
    TorchBackend,
    flat_forward,
    tree_forward,
)
from sapwood.learner.trainer import SAOTrainer, compute_losses
from sapwood.learner.weights import path_probability
from sapwood.platform import runs
from sapwood.platform.store import Store
from sapwood.platform.synthetic import SynthConfig, synthetic_execution
from sapwood.platform.writer import ExecutionWriter

console = Console(stderr=True)
VOCAB = 512


SYNTH = SynthConfig(calls=10, forks=3, fork_depth=2, segments=2, obs_min=20, obs_max=60, out_min=10, out_max=30,
                    system_tokens=60, task_tokens=20, template_tokens=3, summary_tokens=12, vocab_size=VOCAB)


def data_wait(store: Store, *, executions: int, steps: int, backend: str = "torch") -> dict[str, Any]:
    cfg = SYNTH
    for i in track(range(executions), description="loading executions", console=console):
        store.apply(synthetic_execution(SynthConfig(**{**cfg.__dict__, "seed": i}), run_id="bench").events)
    with store.transaction() as conn:
        runs.create_run(conn, "bench-train", runs.ExecutionFilter(run_id="bench"), kind="live")
    torch.manual_seed(0)
    lcfg = LearnerConfig(critic=CriticConfig(warmup_steps=2))
    trainer = SAOTrainer(create_backend(backend, TinyTransformerConfig(vocab_size=VOCAB), lcfg), lcfg)
    learner = Learner(store, "bench-train", trainer, prefetch=True,
                      source_config=SourceConfig(executions_per_batch=2))
    history = []
    for _ in track(range(steps), description="training", console=console):
        m = learner.step(timeout_s=5.0)
        if m is None:
            break
        history.append(m)
    learner.close()
    steady = history[1:]  # the first batch cannot have been prefetched
    wait = sum(m["learner/wait_s"] for m in steady)
    step = sum(m["learner/step_s"] for m in steady)
    tokens = sum(m["train/unique_tokens"] for m in history)
    assembly = sum(m["learner/assembly_s"] for m in history)
    return {
        "steps": len(history),
        "batch_tokens_mean": round(tokens / len(history), 1),
        "assembly_tokens_per_s": round(tokens / assembly),
        "step_s_median": round(statistics.median(m["learner/step_s"] for m in steady), 4),
        "wait_s_median": round(statistics.median(m["learner/wait_s"] for m in steady), 5),
        "wait_share_of_step": round(wait / (wait + step), 4),
    }


def fork_heavy_batch(store: Store, *, prefix: int, ways: int, branch: int) -> Any:
    rng = np.random.default_rng(0)
    w = ExecutionWriter(run_id="forks", task_id="t", vocab_size=VOCAB)
    w.start()
    root = w.prompt(rng.integers(0, VOCAB, prefix)).node_id
    first = w.call(root, [1], rng.integers(0, VOCAB, 64), -rng.random(64))
    obs = w.observe(first.output_node_id, rng.integers(0, VOCAB, 64)).node_id
    w.fork(obs, ways)
    for _ in range(ways):
        w.call(obs, [2], rng.integers(0, VOCAB, branch), -rng.random(branch))
    w.finish("success", reward=1.0)
    store.apply(w.events)
    batch, _ = build_batch(store, [w.execution_id], SourceConfig(jmax=ways))
    return batch


def tree_vs_flat(batch: TreeBatch, model: torch.nn.Module, *, repeats: int) -> dict[str, Any]:
    flat = flatten(batch)
    weight = flat.cat_weight()
    index = flat.cat_index()
    mask = batch.trainable

    def tree_step() -> None:
        model.zero_grad(set_to_none=True)
        out = tree_forward(model, batch)
        (-(out.logprob * mask).sum() + (out.values**2 * mask).sum()).backward()

    def flat_step() -> None:
        model.zero_grad(set_to_none=True)
        out = flat_forward(model, batch, flat)
        m = mask[index] * weight
        (-(out.logprob * m).sum() + (out.values**2 * m).sum()).backward()

    times: dict[str, list[float]] = {"tree": [], "flat": []}
    tree_step()  # warm-up
    flat_step()
    for _ in range(repeats):  # interleaved, so both see the same machine load
        for name, fn in (("tree", tree_step), ("flat", flat_step)):
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    dedup = index.numel() / batch.num_tokens
    speedup = statistics.median(times["flat"]) / statistics.median(times["tree"])
    return {
        "unique_tokens": batch.num_tokens,
        "flattened_tokens": int(index.numel()),
        "dedup_ratio": round(dedup, 3),
        "tree_step_s": round(statistics.median(times["tree"]), 4),
        "flat_step_s": round(statistics.median(times["flat"]), 4),
        "speedup": round(speedup, 3),
        "speedup_over_dedup": round(speedup / dedup, 3),
    }


def backend_vs_torch(batch: TreeBatch, name: str, *, repeats: int) -> dict[str, Any]:
    """Full ``backend.step`` (SAO losses, backward, clipping, both AdamWs) of ``name`` and ``TorchBackend``,
    same weights and batch, interleaved."""
    cfg = LearnerConfig(critic=CriticConfig(warmup_steps=0))
    model_cfg = TinyTransformerConfig(vocab_size=VOCAB)
    torch.manual_seed(0)
    init = TinyActorCritic(model_cfg).state_dict()
    backends = {"torch": create_backend("torch", model_cfg, cfg, init_state=init),
                name: create_backend(name, model_cfg, cfg, init_state=init)}
    targets, _ = SAOTrainer(backends["torch"], cfg).prepare(batch)
    start = {k: float(b.forward(batch).logprob[batch.trainable].sum()) for k, b in backends.items()}

    def step(backend: PolicyBackend) -> None:
        backend.step(batch, lambda out: compute_losses(out, targets, cfg), update_actor=True, update_critic=True)

    times: dict[str, list[float]] = {k: [] for k in backends}
    for b in backends.values():
        step(b)  # warm-up
    for _ in range(repeats):
        for k, b in backends.items():
            t0 = time.perf_counter()
            step(b)
            times[k].append(time.perf_counter() - t0)
    t_torch, t_other = statistics.median(times["torch"]), statistics.median(times[name])
    return {
        "backend": name,
        "torch_step_s": round(t_torch, 4),
        f"{name}_step_s": round(t_other, 4),
        f"{name}_over_torch": round(t_other / t_torch, 3),
        "start_logprob_sum_abs_diff": abs(start["torch"] - start[name]),
    }


def weighting_cost(store: Store, *, batches: int, repeats: int) -> dict[str, Any]:
    ids = []
    for i in range(2 * batches):  # two executions per batch, like part 1's learner
        w = synthetic_execution(SynthConfig(**{**SYNTH.__dict__, "seed": 10_000 + i}), run_id="weights")
        store.apply(w.events)
        ids.append(w.execution_id)
    built = [build_batch(store, ids[2 * k: 2 * k + 2], SourceConfig())[0] for k in range(batches)]
    weight_s: list[float] = []
    steps: dict[str, list[float]] = {"path": [], "unit": []}
    torch.manual_seed(0)
    trainers = {}
    for kind in ("path", "unit"):
        cfg = LearnerConfig(policy=PolicyLossConfig(fork_weighting=kind),  # type: ignore[arg-type]
                            critic=CriticConfig(warmup_steps=0, catchup_max_steps=0))
        trainers[kind] = SAOTrainer(TorchBackend(TinyActorCritic(TinyTransformerConfig(vocab_size=VOCAB))), cfg)
    for batch in track(built, description="token weights", console=console):
        lp = batch.logical_parent()
        path_probability(lp, batch.execution, batch.num_executions)  # warm-up
        for _ in range(repeats):
            t0 = time.perf_counter()
            path_probability(lp, batch.execution, batch.num_executions)
            weight_s.append(time.perf_counter() - t0)
        for trainer in trainers.values():
            trainer.train_step(batch)  # warm-up (also fills the batch's structure caches for both)
        for _ in range(repeats):  # interleaved, so both see the same machine load
            for kind, trainer in trainers.items():
                t0 = time.perf_counter()
                trainer.train_step(batch)
                steps[kind].append(time.perf_counter() - t0)
    w = statistics.median(weight_s)
    step_path, step_unit = statistics.median(steps["path"]), statistics.median(steps["unit"])
    return {
        "batches": batches,
        "batch_tokens_mean": round(statistics.mean(b.num_tokens for b in built), 1),
        "weights_ms": round(1e3 * w, 3),
        "step_s_path_weights": round(step_path, 4),
        "step_s_unit_weights": round(step_unit, 4),
        "weights_share_of_step": round(w / step_path, 5),
        "step_ratio_path_over_unit": round(step_path / step_unit, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--database-url", help="store URL (default: a temporary SQLite file)")
    parser.add_argument("--executions", type=int, default=40)
    parser.add_argument("--steps", type=int, default=15)
    parser.add_argument("--prefix", type=int, default=1024, help="shared prefix tokens of the fork-heavy batch")
    parser.add_argument("--ways", type=int, default=8, help="branches of the fork-heavy batch")
    parser.add_argument("--branch", type=int, default=64, help="tokens per branch")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--weight-batches", type=int, default=4, help="batches of the token-weight part")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--backend", choices=BACKENDS, default="torch",
                        help="learner backend; megatron adds its step time against TorchBackend on the same batch")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        url = args.database_url or f"sqlite:///{Path(tmp) / 'bench.db'}"
        store = Store.open(url)
        figures: dict[str, Any] = {"data": data_wait(store, executions=args.executions, steps=args.steps,
                                                     backend=args.backend)}
        batch = fork_heavy_batch(store, prefix=args.prefix, ways=args.ways, branch=args.branch)
        figures["weights"] = weighting_cost(store, batches=args.weight_batches, repeats=args.repeats)
        store.close()
    torch.manual_seed(0)
    tiny = TinyActorCritic(TinyTransformerConfig(vocab_size=VOCAB))
    model: torch.nn.Module = tiny
    if args.backend == "megatron":
        from sapwood.learner.megatron_backend import MegatronBackend

        model = MegatronBackend(TinyTransformerConfig(vocab_size=VOCAB), init_state=tiny.state_dict()).model
    figures["tree_vs_flat"] = {"backend": args.backend, **tree_vs_flat(batch, model, repeats=args.repeats)}
    if args.backend != "torch":
        figures["backend_vs_torch"] = backend_vs_torch(batch, args.backend, repeats=args.repeats)
    d, f = figures["data"], figures["tree_vs_flat"]
    console.print(f"wait share of a step: {d['wait_share_of_step']:.2%} (target ≤ 5 %); "
                  f"assembly {d['assembly_tokens_per_s']:,} tokens/s; step {d['step_s_median']} s")
    console.print(f"tree vs flattened: speed-up {f['speedup']}× at dedup ratio {f['dedup_ratio']} "
                  f"→ {f['speedup_over_dedup']} × dedup (target ≥ 0.7) [{args.backend}]")
    if "backend_vs_torch" in figures:
        b = figures["backend_vs_torch"]
        console.print(f"{args.backend} step {b[f'{args.backend}_step_s']} s vs TorchBackend {b['torch_step_s']} s "
                      f"on the same batch: {b[f'{args.backend}_over_torch']}×")
    w = figures["weights"]
    console.print(f"token weights: {w['weights_ms']} ms per batch = {w['weights_share_of_step']:.3%} of a "
                  f"{w['step_s_path_weights']} s step; steps with path / unit weights "
                  f"{w['step_ratio_path_over_unit']}×")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
