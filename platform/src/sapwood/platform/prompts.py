"""A run's prompt queue: load a dataset, claim prompt samples under a lease, see progress per epoch.

``sapwood runs add-prompts RUN --from FILE`` reads a dataset (:func:`read_dataset`: JSONL, Parquet, or a
Hugging Face ``datasets`` folder saved with ``save_to_disk``) and queues ``samples_per_prompt`` samples
of every prompt for each of ``epochs`` epochs. Rollout workers claim samples (the recorder SDK's
``claim_prompt``), record one execution per sample, and a sample is done when that execution finished
in the store; the semantics (leases, re-issue, abandoned executions) are
:mod:`sapwood.platform.storage.prompts_sql`'s.

A dataset row has a ``prompt`` (text, or OpenAI-style chat messages: a list of ``{"role", "content"}``
objects), optional ``task_id`` (default ``prompt-<row>``), ``task_family`` (default ``default``) and
``metadata`` (an object); any other column goes into the metadata.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sqlalchemy.engine import Connection

from sapwood.platform.errors import ValidationError
from sapwood.platform.runs import check_storable_json, get_run
from sapwood.platform.storage.backends import prompt_queue
from sapwood.platform.storage.prompts_sql import ClaimedSample, PromptRow

__all__ = ["ClaimedSample", "PromptRow", "add_prompts", "all_prompt_progress", "claim_prompts", "prompt_progress",
           "read_dataset", "row_to_prompt"]

_KNOWN = ("prompt", "task_id", "task_family", "metadata")


def row_to_prompt(row: dict[str, Any], index: int) -> PromptRow:
    """Validate one dataset row (``index``: its position, for messages and the default task id)."""
    if "prompt" not in row:
        raise ValidationError(f"row {index}: no 'prompt' column (found {sorted(row)})")
    prompt = row["prompt"]
    if isinstance(prompt, str):
        if not prompt:
            raise ValidationError(f"row {index}: the prompt is empty")
    elif isinstance(prompt, list) and prompt:
        for j, m in enumerate(prompt):
            if not (isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)):
                raise ValidationError(f"row {index}: message {j} must be an object with string 'role' and "
                                      f"'content', got {m!r:.80}")
        prompt = [{"role": m["role"], "content": m["content"]} for m in prompt]
    else:
        raise ValidationError(f"row {index}: 'prompt' must be text or a non-empty list of chat messages, "
                              f"got {type(prompt).__name__}")
    meta = row.get("metadata") or {}
    if not isinstance(meta, dict):
        raise ValidationError(f"row {index}: 'metadata' must be an object, got {type(meta).__name__}")
    meta = {**{k: v for k, v in row.items() if k not in _KNOWN}, **meta}
    task_id = row.get("task_id") or f"prompt-{index}"
    family = row.get("task_family") or "default"
    if not isinstance(task_id, str) or not isinstance(family, str) or len(task_id) > 256 or len(family) > 128:
        raise ValidationError(f"row {index}: task_id (≤ 256 chars) and task_family (≤ 128) must be text")
    check_storable_json(meta, f"row {index} metadata")
    check_storable_json(prompt, f"row {index} prompt")
    return PromptRow(prompt=prompt, task_id=task_id, task_family=family, metadata=meta)


def read_dataset(path: str | Path, *, split: str = "train") -> list[PromptRow]:
    """The rows of a JSONL file, a Parquet file, or a ``datasets`` folder (``split`` of a DatasetDict)."""
    path = Path(path)
    if not path.exists():
        raise ValidationError(f"dataset {path} does not exist")
    if path.is_dir():
        records = _read_saved_dataset(path, split)
    elif path.suffix in (".jsonl", ".ndjson"):
        records = []
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise ValidationError(f"{path}:{n}: not JSON ({exc.msg})") from None
            if not isinstance(records[-1], dict):
                raise ValidationError(f"{path}:{n}: expected a JSON object per line")
    elif path.suffix == ".parquet":
        import pyarrow.parquet as pq

        records = pq.read_table(path).to_pylist()
    else:
        raise ValidationError(f"dataset {path}: expected a .jsonl or .parquet file or a datasets folder")
    if not records:
        raise ValidationError(f"dataset {path} has no rows")
    return [row_to_prompt(r, i) for i, r in enumerate(records)]


def _read_saved_dataset(path: Path, split: str) -> list[dict[str, Any]]:
    """Rows of a folder written by ``datasets``' ``save_to_disk`` (Arrow stream files + state.json)."""
    import pyarrow as pa

    if (path / "dataset_dict.json").exists():
        splits = json.loads((path / "dataset_dict.json").read_text()).get("splits", [])
        if split not in splits:
            raise ValidationError(f"dataset {path} has splits {splits}, not {split!r} (pass --split)")
        path = path / split
    state = path / "state.json"
    if not state.exists():
        raise ValidationError(f"{path} is not a saved datasets folder (no state.json)")
    files = [path / f["filename"] for f in json.loads(state.read_text()).get("_data_files", [])]
    rows: list[dict[str, Any]] = []
    for f in files:
        with pa.memory_map(str(f)) as source:
            rows.extend(pa.ipc.open_stream(source).read_all().to_pylist())
    return rows


def add_prompts(conn: Connection, run_id: str, rows: list[PromptRow], *, samples_per_prompt: int = 1,
                epochs: int = 1) -> int:
    """Queue ``rows`` for run ``run_id`` (which must exist); returns the number of samples queued."""
    if samples_per_prompt < 1 or epochs < 1:
        raise ValidationError(f"samples per prompt and epochs must be ≥ 1, got {samples_per_prompt}, {epochs}")
    run = get_run(conn, run_id)
    return prompt_queue(conn).add(conn, run_id, rows, samples_per_prompt=samples_per_prompt, epochs=epochs,
                                  seed=int(run["seed"]))


def claim_prompts(conn: Connection, run_id: str, worker: str, limit: int = 1, *,
                  lease_s: float) -> list[ClaimedSample]:
    """Claim up to ``limit`` prompt samples of ``run_id`` for ``worker`` until now + ``lease_s``."""
    if lease_s <= 0:
        raise ValidationError(f"lease_s must be > 0, got {lease_s}")
    return prompt_queue(conn).claim(conn, run_id, worker, limit, lease_s=lease_s)


def prompt_progress(conn: Connection, run_id: str) -> dict[int, dict[str, int]]:
    """Per epoch: ``pending`` / ``claimed`` / ``done`` samples and ``abandoned`` executions."""
    return prompt_queue(conn).progress(conn, run_id)


def all_prompt_progress(conn: Connection) -> dict[str, dict[int, dict[str, int]]]:
    """:func:`prompt_progress` of every run that has a prompt queue, by run id."""
    q = prompt_queue(conn)
    return {run_id: q.progress(conn, run_id) for run_id in q.runs(conn)}
