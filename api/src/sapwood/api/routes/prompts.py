"""Prompt queue progress of a run: samples pending / claimed / done and abandoned executions per epoch."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from pydantic import Field

from sapwood.api.deps import ReadKey, ServicesDep
from sapwood.api.queries import prompts as q
from sapwood.api.routes import AUTH_ERRORS, NOT_FOUND
from sapwood.api.routes.runs import RunIdPath
from sapwood.api.schemas import _Out

router = APIRouter(prefix="/v1/runs", tags=["runs"], responses=AUTH_ERRORS)


class PromptCounts(_Out):
    pending: int = Field(description="samples not claimed yet (or re-issued after a lease ran out)")
    claimed: int = Field(description="samples a rollout worker holds a lease on")
    done: int = Field(description="samples whose execution finished")
    abandoned: int = Field(description="executions of a worker that died mid-rollout (kept, never trained)")


class EpochProgress(PromptCounts):
    epoch: int


class PromptProgressOut(_Out):
    run_id: str
    epochs: list[EpochProgress] = Field(description="one entry per epoch, ascending; empty without prompts")
    total: PromptCounts
    samples: int = Field(description="prompt samples queued (pending + claimed + done)")
    fraction_done: float | None = Field(description="done / samples; null without prompts")


@router.get("/{run_id}/prompts/progress", response_model=PromptProgressOut, responses={**NOT_FOUND})
def prompt_progress(run_id: RunIdPath, services: ServicesDep, _key: ReadKey) -> dict[str, Any]:
    """The run's prompt queue per epoch: pending / claimed / done samples and abandoned executions."""
    with services.write() as conn:  # the queue first marks done the samples whose execution finished
        return q.prompt_progress_of_run(conn, run_id)
