"""``sapwood chaos training``: the training chaos campaign (:mod:`sapwood.demo.chaos.campaign`).

Only typer is imported with this module (the ``sapwood`` CLI registers it on every start); the campaign
(torch, the learner, matplotlib) is imported when the command runs.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated

import typer

chaos_app = typer.Typer(help="Chaos campaigns: kill -9 the processes of a real run, then audit the store.",
                        no_args_is_help=True)


@chaos_app.command("training")
def training(
    database_url: Annotated[str | None, typer.Option(
        "--database-url", envvar="SAPWOOD_DATABASE_URL", help="PostgreSQL URL (default: SAPWOOD_TEST_DATABASE_URL)",
    )] = None,
    prompts: Annotated[int, typer.Option(min=1, help="synthetic prompts in the run's queue")] = 200,
    samples: Annotated[int, typer.Option(min=1, help="samples per prompt")] = 2,
    workers: Annotated[int, typer.Option(min=1, help="rollout worker processes")] = 3,
    learners: Annotated[int, typer.Option(min=1, help="sapwood learn processes")] = 2,
    kills: Annotated[int, typer.Option(min=0, help="random kill -9s (fault points come on top)")] = 30,
    seed: Annotated[int, typer.Option(help="seed of the run, the kills and the fault points")] = 0,
    lease_s: Annotated[float, typer.Option(min=0.1, help="lease of a prompt sample and of a learner claim")] = 2.0,
    call_s: Annotated[float, typer.Option(min=0, help="simulated generation seconds per model call")] = 0.05,
    max_seconds: Annotated[float, typer.Option(min=1, help="give up a run after this long")] = 1800.0,
    out: Annotated[Path | None, typer.Option(help="folder for logs, checkpoints and the PNG")] = None,
    kafka: Annotated[str | None, typer.Option(metavar="BOOTSTRAP", help="record through Kafka, applied by ingest")] = (
        None),
    ingests: Annotated[int, typer.Option(min=1, help="ingest processes (with --kafka)")] = 2,
    scheduler: Annotated[bool, typer.Option(help="run (and kill) the live scheduler")] = True,
    compare: Annotated[bool, typer.Option(help="also run with no fault; compare evaluation rewards (PNG)")] = True,
    mid_switch_rounds: Annotated[int, typer.Option(min=0, help="runtime.mid_switch crash rounds on a Ray runtime "
                                                   "beside the run (0: none)")] = 2,
) -> None:
    """Kill -9 workers, ingest, learners and the scheduler of a run; print one JSON line of figures."""
    from sapwood.demo.chaos.campaign import run_campaign

    url = database_url or os.environ.get("SAPWOOD_TEST_DATABASE_URL")
    if not url:
        raise typer.BadParameter("pass --database-url (or set SAPWOOD_TEST_DATABASE_URL)")
    figures = run_campaign(url, prompts=prompts, samples=samples, workers=workers, learners=learners, kills=kills,
                           seed=seed, lease_s=lease_s, call_s=call_s, out=out, max_seconds=max_seconds, kafka=kafka,
                           ingests=ingests, scheduler=scheduler, compare=compare,
                           mid_switch_rounds=mid_switch_rounds)
    print(json.dumps(figures))


def register(app: typer.Typer) -> None:
    app.add_typer(chaos_app, name="chaos")
