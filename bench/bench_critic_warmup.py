"""How much a critic warmed from replayed history helps a short run: held-out reward after a few steps, side by side.

    python bench/bench_critic_warmup.py [--seeds 5] [--replay 0 64 128] [--steps 6] [--eval-executions 256]

Per seed, every arm starts from the same pre-trained policy (version 0) and plays the same synchronous loop,
the elastic demo's workload without its cells: ``--steps`` times, the current policy plays 8 tasks (the same
tasks and sampling seeds in every arm) and the learner trains one SAO step on them. Arms differ only in the
critic they start with:

* ``in-run 1``: a critic from random weights and one critic-only step of the run itself before the policy
  moves (the elastic demo before ``critic_replay_executions``);
* ``replay N``: the critic warmed by :func:`sapwood.demo.critic_warmup.warm_critic_from_replay` on ``N``
  executions of version 0 (one critic step per 8), then every step moves the policy.

Prints, per seed and arm, the held-out reward at the end minus at the start (``--eval-executions`` tasks, the
same tasks and sampling seeds before and after), and one JSON line.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from sapwood.demo.config import TASK_FAMILY, DemoConfig
from sapwood.demo.critic_warmup import warm_critic_from_replay
from sapwood.demo.phases import EVAL_STREAM, eval_tasks, evaluate, pretrained_policy
from sapwood.demo.tasks import KeyRecallEnv
from sapwood.learner.backends import create_backend
from sapwood.learner.config import SourceConfig
from sapwood.learner.loop import Learner
from sapwood.learner.trainer import SAOTrainer
from sapwood.platform import runs
from sapwood.platform.storage.dialects import embedded_url
from sapwood.platform.store import Store
from sapwood.rollout.recorder import Recorder
from sapwood.rollout.torch_engine import LocalTorchEngine
from sapwood.rollout.transports import InProcessTransport

BATCH = 8
TRAIN_STREAM = 31


def play(cfg: DemoConfig, store: Store, run_id: str, state: dict[str, torch.Tensor], version: int,
         tasks: list, stream: int) -> float:
    """Play ``tasks`` with ``state`` into ``run_id``; returns their mean reward."""
    model_cfg = cfg.model_config()
    rec = Recorder(InProcessTransport(store, batch_size=256), run_id=run_id, engine=LocalTorchEngine.name,
                   vocab_size=model_cfg.vocab_size, task_family=TASK_FAMILY)
    engine = LocalTorchEngine(model_cfg, state=state, policy_version=version, seed=cfg.seed)
    reports = evaluate(cfg, engine, rec, tasks, run_id, stream=stream)
    rec.close()
    return float(np.mean([r.reward for r in reports]))


def train_arm(cfg: DemoConfig, state: dict[str, torch.Tensor], warmup_steps: int, steps: int,
              out: Path) -> dict[str, torch.Tensor]:
    """``steps`` synchronous rounds (play a batch, train one step) from ``state``; returns the final weights."""
    out.mkdir(parents=True)
    store = Store.open(embedded_url(out / "run.db"))
    try:
        with store.transaction() as conn:
            runs.create_run(conn, "learn", runs.ExecutionFilter(run_id="rollouts"), kind="live", seed=cfg.seed)
        lcfg = cfg.learner_config()
        lcfg = replace(lcfg, critic=replace(lcfg.critic, warmup_steps=warmup_steps))
        torch.manual_seed(cfg.seed + 1)
        backend = create_backend("torch", cfg.model_config(), lcfg, init_state=state)
        learner = Learner(store, "learn", SAOTrainer(backend, lcfg), checkpoint_dir=out / "checkpoints",
                          source_config=SourceConfig(jmax=cfg.jmax, executions_per_batch=BATCH, seed=cfg.seed))
        env = KeyRecallEnv(cfg.task)
        current = state
        for step in range(steps):
            rng = np.random.default_rng([cfg.seed, TRAIN_STREAM, step])
            tasks = [env.sample_task(rng, task_id=f"task-{step}-{i}") for i in range(BATCH)]
            play(cfg, store, "rollouts", current, step, tasks, TRAIN_STREAM + step)
            learner.step(timeout_s=10.0)
            current = {k: v.detach().clone() for k, v in backend.state_dict()["model"].items()}
        learner.close()
        return current
    finally:
        store.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--replay", type=int, nargs="+", default=[64, 128], help="replayed executions per replay arm")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--eval-executions", type=int, default=256)
    args = ap.parse_args()
    torch.set_num_threads(1)
    console = Console(stderr=True)
    arms = ["in-run 1", *[f"replay {n}" for n in args.replay]]
    rows: list[dict] = []
    root = Path(tempfile.mkdtemp(prefix="sapwood-bench-critic-"))
    with Progress(console=console) as progress:
        bar = progress.add_task("seeds × arms", total=args.seeds * len(arms))
        for seed in range(args.seeds):
            cfg = DemoConfig(seed=seed, eval_executions=args.eval_executions)
            state0, _, _ = pretrained_policy(cfg)
            eval_store = Store.open(embedded_url(root / f"eval-{seed}.db"))
            held_out = eval_tasks(cfg)
            start = play(cfg, eval_store, "eval-start", state0, 0, held_out, stream=EVAL_STREAM)
            row: dict = {"seed": seed, "start": round(start, 4)}
            for arm in arms:
                if arm == "in-run 1":
                    state, warmup_steps = state0, 1
                else:
                    n = int(arm.split()[1])
                    state, _ = warm_critic_from_replay(cfg, state0, n, BATCH, root / f"warm-{seed}-{n}")
                    warmup_steps = 0
                slug = arm.replace(" ", "-")
                final = train_arm(cfg, state, warmup_steps, args.steps, root / f"{seed}-{slug}")
                end = play(cfg, eval_store, f"eval-end-{slug}", final, args.steps, held_out, stream=EVAL_STREAM)
                row[arm] = round(end - start, 4)
                progress.advance(bar)
            eval_store.close()
            rows.append(row)
    table = Table(title=f"held-out reward, end − start ({args.steps} steps of {BATCH}, "
                        f"{args.eval_executions} evaluation tasks)")
    for col in ("seed", "start", *arms):
        table.add_column(col, justify="right")
    for row in rows:
        table.add_row(str(row["seed"]), f"{row['start']:.3f}", *[f"{row[a]:+.3f}" for a in arms])
    summary = {arm: {"mean": round(float(np.mean([r[arm] for r in rows])), 4),
                     "min": round(min(r[arm] for r in rows), 4), "rose": sum(r[arm] > 0 for r in rows)}
               for arm in arms}
    table.add_row("mean", "", *[f"{summary[a]['mean']:+.3f}" for a in arms])
    table.add_row("min", "", *[f"{summary[a]['min']:+.3f}" for a in arms])
    Console().print(table)
    print(json.dumps({"steps": args.steps, "eval_executions": args.eval_executions, "seeds": rows,
                      "arms": summary}), flush=True)


if __name__ == "__main__":
    main()
