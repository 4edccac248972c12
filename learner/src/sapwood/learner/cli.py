"""``sapwood learn``: run a learner against a store (embedded SQLite or PostgreSQL)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

console = Console()


def register(app: typer.Typer) -> None:
    app.command("learn")(learn)


def learn(
    run: Annotated[str, typer.Option(help="training run to consume (created if missing)")],
    database_url: Annotated[str | None, typer.Option(envvar="SAPWOOD_DATABASE_URL", help="store URL")] = None,
    source_run: Annotated[str | None, typer.Option(help="make RUN a live run over these")] = None,
    max_steps: Annotated[int, typer.Option(help="stop after this many batches")] = 100,
    idle_timeout: Annotated[float, typer.Option(help="stop when no batch arrives for this long (s)")] = 10.0,
    jmax: Annotated[int | None, typer.Option(
        help="at most this many trajectories per execution, >= 1 (default: learner.config.DEFAULT_JMAX)")] = None,
    executions_per_batch: int = 4,
    checkpoint_dir: Annotated[Path, typer.Option(help="where policy checkpoints are written")] = Path("checkpoints"),
    vocab_size: Annotated[int | None, typer.Option(help="model vocabulary (default: from the executions)")] = None,
    threads: Annotated[int, typer.Option(help="torch CPU threads")] = 2,
    backend_name: Annotated[str, typer.Option("--backend", help="learner backend: torch | megatron")] = "torch",
    lease_s: Annotated[float, typer.Option(help="claim lease (s): a dead learner's claims return after it")] = 600.0,
    checkpoint_grace_s: Annotated[float, typer.Option(help="remove unpublished checkpoints older than this (s)")
                                  ] = 3600.0,
    critic_warmup_steps: Annotated[int, typer.Option(help="critic-only steps before the first policy update")] = 8,
    seed: Annotated[int, typer.Option(help="torch seed of the initial weights (a fresh run)")] = 0,
    identity: Annotated[str | None, typer.Option(
        help="stable learner identity (e.g. its slot): a restart takes its dead predecessor's claims over at "
             "once instead of after --lease-s")] = None,
) -> None:
    """Claim Jmax-bounded batches of RUN exactly once, train CompactionRL + SAO steps, publish versions."""
    import torch
    from rich.progress import Progress

    from sapwood.learner.backends import BACKENDS, create_backend
    from sapwood.learner.config import DEFAULT_JMAX, CriticConfig, LearnerConfig, SourceConfig, check_jmax
    from sapwood.learner.errors import ConfigError
    from sapwood.learner.loop import Learner
    from sapwood.learner.model import TinyTransformerConfig
    from sapwood.learner.trainer import SAOTrainer
    from sapwood.platform import runs
    from sapwood.platform.errors import UnknownParentError
    from sapwood.platform.settings import Settings
    from sapwood.platform.storage.learner_reads import largest_vocab_size
    from sapwood.platform.store import Store

    try:
        jmax = check_jmax(DEFAULT_JMAX if jmax is None else jmax)
    except ConfigError as exc:
        raise typer.BadParameter(f"--jmax: {exc}") from None
    if backend_name not in BACKENDS:
        raise typer.BadParameter(f"--backend must be one of {', '.join(BACKENDS)}, got {backend_name!r}")
    torch.set_num_threads(threads)
    store = Store.open(database_url or Settings().database_url)
    with store.transaction() as conn:
        try:
            runs.get_run(conn, run)
        except UnknownParentError:
            if source_run is None:
                raise typer.BadParameter(f"run {run!r} does not exist; pass --source-run to create it") from None
            runs.create_run(conn, run, runs.ExecutionFilter(run_id=source_run), kind="live")
        if vocab_size is None:
            vocab_size = largest_vocab_size(conn)
    if not vocab_size:
        raise typer.BadParameter("no vocab_size recorded; pass --vocab-size")
    if lease_s <= 0 or critic_warmup_steps < 0:
        raise typer.BadParameter(f"--lease-s must be > 0 and --critic-warmup-steps ≥ 0, got {lease_s}, "
                                 f"{critic_warmup_steps}")
    torch.manual_seed(seed)
    config = LearnerConfig(jmax=jmax, critic=CriticConfig(warmup_steps=critic_warmup_steps))
    backend = create_backend(backend_name, TinyTransformerConfig(vocab_size=int(vocab_size)), config)
    source_config = SourceConfig(jmax=jmax, executions_per_batch=executions_per_batch, lease_s=lease_s)
    learner = Learner(store, run, SAOTrainer(backend, config), checkpoint_dir=checkpoint_dir, prefetch=True,
                      checkpoint_grace_s=checkpoint_grace_s, source_config=source_config, identity=identity)
    resumed = learner.resume()
    if resumed is not None:
        console.print(f"resumed from policy version {resumed}")
    with Progress(console=console) as progress:
        task = progress.add_task("training", total=max_steps)
        for _ in range(max_steps):
            lost = learner.lost_claims
            metrics = learner.step(timeout_s=idle_timeout)
            if metrics is None and learner.lost_claims == lost:
                break  # idle (a rolled-back commit goes on with the next batch)
            if metrics is None:
                continue
            progress.update(task, advance=1, description=f"v{int(metrics['policy/version'])} "
                            f"reward {metrics['learner/rewards_mean']:.3f}")
    learner.close()
    last = learner.history[-1] if learner.history else {}
    print(json.dumps({"steps": len(learner.history), "backend": backend_name, "policy_version": backend.policy_version,
                      "lost_claims": learner.lost_claims, **{k: round(v, 5) for k, v in last.items()}}))
