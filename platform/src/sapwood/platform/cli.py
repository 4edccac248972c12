"""The ``sapwood`` command line. Components add their commands via ``sapwood.<component>.cli.register``."""

from __future__ import annotations

import importlib
import json
import time
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.table import Table

from sapwood.platform.settings import Settings

if TYPE_CHECKING:
    from sapwood.platform.store import Store

app = typer.Typer(help="Sapwood: the trajectory data platform for long-horizon agent RL.", no_args_is_help=True)
db_app = typer.Typer(help="Database schema migrations.", no_args_is_help=True)
app.add_typer(db_app, name="db")
drift_app = typer.Typer(help="Retokenization drift per run (chat calls recorded through the gateway).",
                        no_args_is_help=True)
app.add_typer(drift_app, name="drift")
console = Console()

DatabaseOpt = Annotated[
    str | None,
    typer.Option("--database-url", envvar="SAPWOOD_DATABASE_URL", help="SQLAlchemy URL (default: ./sapwood.db)"),
]


def _url(database_url: str | None) -> str:
    return database_url or Settings().database_url


@db_app.command("upgrade")
def db_upgrade(database_url: DatabaseOpt = None, revision: str = "head") -> None:
    """Apply migrations up to REVISION (default: head)."""
    from sapwood.platform.store import Store

    store = Store.open(_url(database_url), migrate=False)
    store.migrate(revision)
    console.print(f"database at revision [bold]{store.current_revision()}[/]")


@db_app.command("downgrade")
def db_downgrade(revision: str, database_url: DatabaseOpt = None) -> None:
    """Revert migrations down to REVISION (e.g. base)."""
    from sapwood.platform.store import Store

    store = Store.open(_url(database_url), migrate=False)
    store.downgrade(revision)
    console.print(f"database at revision [bold]{store.current_revision()}[/]")


@db_app.command("current")
def db_current(database_url: DatabaseOpt = None) -> None:
    """Print the current migration revision."""
    from sapwood.platform.store import Store

    console.print(Store.open(_url(database_url), migrate=False).current_revision() or "base (empty)")


@app.command()
def synth(
    database_url: DatabaseOpt = None,
    executions: Annotated[int, typer.Option(help="synthetic executions to load")] = 1,
    calls: Annotated[int, typer.Option(help="model calls per execution")] = 300,
    forks: int = 4,
    segments: int = 3,
    seed: int = 0,
) -> None:
    """Load synthetic long-horizon executions into the store and print tree statistics."""
    from rich.progress import Progress

    from sapwood.platform.store import Store
    from sapwood.platform.synthetic import SynthConfig, synthetic_execution

    store = Store.open(_url(database_url))
    tokens = 0
    t0 = time.perf_counter()
    with Progress(console=console) as progress:
        task = progress.add_task("loading executions", total=executions)
        for i in range(executions):
            w = synthetic_execution(SynthConfig(calls=calls, forks=forks, segments=segments, seed=seed + i))
            tokens += store.apply(w.events).tokens
            progress.advance(task)
    elapsed = time.perf_counter() - t0
    _print_stats(store.stats())
    console.print(f"applied {tokens:,} tokens in {elapsed:.2f} s ({tokens / elapsed:,.0f} tokens/s)")
    print(json.dumps({"tokens": tokens, "seconds": round(elapsed, 3), **store.stats()}))


@app.command()
def stats(database_url: DatabaseOpt = None) -> None:
    """Print store statistics (tokens, dedup ratio, executions by status, retokenization drift per run)."""
    from sapwood.platform.store import Store

    store = Store.open(_url(database_url))
    _print_stats(store.stats())
    _print_drift(store)
    from sapwood.platform.prompts import all_prompt_progress

    with store.transaction() as conn:
        progress = all_prompt_progress(conn)
    if progress:
        table = Table(title="Prompt queues (samples per state; abandoned executions)")
        for col in ("run", "epoch", "pending", "claimed", "done", "abandoned"):
            table.add_column(col)
        for run_id, epochs in progress.items():
            for epoch, counts in epochs.items():
                table.add_row(
                    run_id, str(epoch), *(f"{counts[k]:,}" for k in ("pending", "claimed", "done", "abandoned"))
                )
        console.print(table)


def _print_drift(store: Store) -> None:
    """The run-level drift table: runs with at least one chat call checked for retokenization drift."""
    rows = [d for d in store.drift() if d.checked]
    if not rows:
        return
    table = Table(title="Retokenization drift (chat calls whose previous output did not come back verbatim)")
    for col in ("run", "calls", "checked", "drifted", "rate", "first position"):
        table.add_column(col)
    for d in rows:
        table.add_row(d.run_id, f"{d.calls:,}", f"{d.checked:,}", f"{d.drifted:,}", f"{d.rate:.2%}",
                      "-" if d.first_position is None else str(d.first_position))
    console.print(table)


@drift_app.command("check")
def drift_check(
    max_rate: Annotated[str, typer.Option("--max-rate", help="highest drift rate that passes, in [0, 1] (e.g. 0.03)")],
    run_id: Annotated[
        list[str] | None,
        typer.Option("--run-id", help="run to check (repeatable; default: every run with a checked call)"),
    ] = None,
    database_url: DatabaseOpt = None,
) -> None:
    """A CI gate: exit 1 when a run's retokenization drift rate is above --max-rate (a rate equal to it passes).

    Exit 2 when there is nothing to gate: a named run without checked chat calls, or no run with one."""
    from sapwood.platform.storage.drift import over_limit, parse_max_rate
    from sapwood.platform.store import Store

    try:
        limit = parse_max_rate(max_rate)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--max-rate") from None
    store = Store.open(_url(database_url))
    try:
        if run_id:
            rows = []
            for r in run_id:
                found = store.drift(r)
                if not found or not found[0].checked:
                    why = "no recorded calls" if not found else f"{found[0].calls:,} calls, none checked for drift"
                    console.print(f"drift check: run {r!r} has {why}: nothing to gate", style="red")
                    raise typer.Exit(2)
                rows += found
        else:
            rows = [d for d in store.drift() if d.checked]
            if not rows:
                console.print("drift check: no run has a chat call checked for drift: nothing to gate", style="red")
                raise typer.Exit(2)
    finally:
        store.close()
    over = {d.run_id for d in over_limit(rows, limit)}
    for d in rows:
        verdict = "is above" if d.run_id in over else "is within"
        console.print(f"drift check: run {d.run_id!r}: drift rate {d.drifted}/{d.checked} = {d.rate:.2%} "
                      f"{verdict} the limit {float(limit):.2%}", style="red" if d.run_id in over else None,
                      highlight=False, soft_wrap=True)
    if over:
        raise typer.Exit(1)


@app.command()
def rebuild(database_url: DatabaseOpt = None) -> None:
    """Drop every projection, rebuild it from the events, and prove the rebuild identical."""
    from sapwood.platform.store import Store

    store = Store.open(_url(database_url))
    before = store.projection_hash()
    n = store.rebuild_projections()
    after = store.projection_hash()
    console.print(f"replayed {n:,} events; projection hash {before[:16]} → {after[:16]}")
    if before != after:
        console.print("[red]rebuild differs from the live projection[/]")
        raise typer.Exit(1)
    console.print("[green]rebuild identical[/]")


runs_app = typer.Typer(help="Training runs and their prompt queues.", no_args_is_help=True)
app.add_typer(runs_app, name="runs")


@runs_app.command("add-prompts")
def runs_add_prompts(
    run: Annotated[str, typer.Argument(help="run id (created as a live run over its own rollouts if missing)")],
    source: Annotated[str, typer.Option("--from", help="JSONL, Parquet, or a saved datasets folder")],
    samples_per_prompt: Annotated[int, typer.Option(help="rollouts per prompt and epoch")] = 1,
    epochs: Annotated[int, typer.Option(help="passes over the dataset")] = 1,
    split: Annotated[str, typer.Option(help="split of a datasets DatasetDict folder")] = "train",
    database_url: DatabaseOpt = None,
) -> None:
    """Queue a dataset's prompts for RUN's rollout workers (each sample rolled out once)."""
    from sapwood.platform import runs
    from sapwood.platform.errors import SapwoodError, UnknownParentError
    from sapwood.platform.prompts import add_prompts, read_dataset
    from sapwood.platform.store import Store

    try:
        rows = read_dataset(source, split=split)
        store = Store.open(_url(database_url))
        with store.transaction() as conn:
            try:
                runs.get_run(conn, run)
            except UnknownParentError:
                runs.create_run(conn, run, runs.ExecutionFilter(run_id=run), kind="live")
                console.print(f"created live run {run!r} over the executions recorded under it")
            n = add_prompts(conn, run, rows, samples_per_prompt=samples_per_prompt, epochs=epochs)
    except SapwoodError as exc:
        console.print(f"[red]error:[/] {exc}")
        raise typer.Exit(2) from None
    print(json.dumps({"run": run, "prompts": len(rows), "samples": n}))


def _print_stats(s: dict[str, object]) -> None:
    table = Table(title="Sapwood store", show_header=False)
    for key, value in s.items():
        table.add_row(key, f"{value:,}" if isinstance(value, int) else str(value))
    console.print(table)


#: Per component whose package needs an extra's packages to import: (extra, its top-level commands).
_EXTRA_COMMANDS = {
    "learner": ("learner", ("learn",)),
    "scheduler": ("scheduler", ("scheduler",)),
    "api": ("api", ("serve", "keys")),
    "demo": ("demo", ("demo",)),
    "gateway": ("gateway", ("gateway",)),
}


def _needs_extra(command: str, extra: str, missing: str) -> None:
    """Register ``command`` as a stub that says which extra to install (its component could not be imported)."""

    @app.command(
        command,
        hidden=True,
        add_help_option=False,
        context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    )
    def _stub() -> None:
        console.print(
            f"[red]error:[/] `sapwood {command}` needs {missing}, which this installation lacks: "
            f"install sapwood\\[{extra}] (pip install 'sapwood\\[{extra}]')"
        )
        raise typer.Exit(1)


# Component commands (ingest, learn, serve, demo, ...) register themselves when installed; a component
# whose extra is not installed gets stubs naming that extra.
for _component in ("ingest", "learner", "scheduler", "api", "demo", "gateway"):
    try:
        _mod = importlib.import_module(f"sapwood.{_component}.cli")
    except ModuleNotFoundError as _exc:
        if _exc.name == f"sapwood.{_component}.cli":
            continue
        if (_exc.name or "sapwood").split(".")[0] == "sapwood" or _component not in _EXTRA_COMMANDS:
            raise
        _extra, _commands = _EXTRA_COMMANDS[_component]
        for _command in _commands:
            _needs_extra(_command, _extra, _exc.name or "a package")
        continue
    _mod.register(app)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
