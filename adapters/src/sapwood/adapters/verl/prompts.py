"""verl-style prompt datasets in and out of a Sapwood run's prompt queue.

verl's RL datasets are Parquet files with one row per prompt: ``prompt`` (chat messages), ``data_source``
(the task family), ``ability``, ``reward_model`` (``{"style", "ground_truth"}``) and ``extra_info`` (an
object, often with an ``index``). :func:`import_verl_parquet` queues such a file: ``data_source`` becomes
the task family, ``extra_info.index`` (when present) the task id, and every other column is kept in the
sample's metadata, so :func:`export_verl_parquet` writes the same columns back.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sqlalchemy.engine import Connection

from sapwood.platform.errors import ValidationError
from sapwood.platform.prompts import PromptRow, add_prompts, row_to_prompt
from sapwood.platform.storage.backends import prompt_queue

__all__ = ["VERL_COLUMNS", "export_verl_parquet", "import_verl_parquet", "verl_record_to_prompt"]

#: The columns verl's ``RLHFDataset`` reads (besides ``prompt``), kept through a round trip.
VERL_COLUMNS = ("data_source", "ability", "reward_model", "extra_info")


def verl_record_to_prompt(record: dict[str, Any], index: int) -> PromptRow:
    """One verl dataset row as a prompt row (``index``: its position, for messages and the default id)."""
    if "prompt" not in record:
        raise ValidationError(f"row {index}: a verl dataset row needs a 'prompt' column (found {sorted(record)})")
    extra = record.get("extra_info") or {}
    if not isinstance(extra, dict):
        raise ValidationError(f"row {index}: 'extra_info' must be an object, got {type(extra).__name__}")
    task_id = record.get("task_id") or (f"{record.get('data_source', 'verl')}-{extra['index']}"
                                        if extra.get("index") is not None else None)
    meta = {k: record[k] for k in record if k not in ("prompt", "task_id", "task_family", "metadata")}
    row = {"prompt": _messages(record["prompt"], index), "task_id": task_id,
           "task_family": record.get("data_source") or record.get("task_family"), "metadata": meta}
    return row_to_prompt(row, index)


def _messages(prompt: Any, index: int) -> Any:
    """verl stores messages as a list of structs; Parquet may give back numpy arrays of dicts."""
    if isinstance(prompt, str | list):
        return prompt
    if hasattr(prompt, "tolist"):
        return list(prompt.tolist())
    raise ValidationError(f"row {index}: 'prompt' must be chat messages or text, got {type(prompt).__name__}")


def import_verl_parquet(conn: Connection, run_id: str, path: str | Path, *, samples_per_prompt: int = 1,
                        epochs: int = 1) -> int:
    """Queue every row of the verl Parquet file ``path`` for run ``run_id``; returns the samples queued."""
    import pyarrow.parquet as pq

    path = Path(path)
    if not path.exists():
        raise ValidationError(f"dataset {path} does not exist")
    records = pq.read_table(path).to_pylist()
    if not records:
        raise ValidationError(f"dataset {path} has no rows")
    rows = [verl_record_to_prompt(r, i) for i, r in enumerate(records)]
    return add_prompts(conn, run_id, rows, samples_per_prompt=samples_per_prompt, epochs=epochs)


def export_verl_parquet(conn: Connection, run_id: str, path: str | Path) -> int:
    """Write the distinct prompts queued for ``run_id`` as a verl Parquet dataset; returns the rows written."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    prompts = prompt_queue(conn).prompts(conn, run_id)
    if not prompts:
        raise ValidationError(f"run {run_id} has no queued prompts")
    out: list[dict[str, Any]] = []
    for p in prompts:
        meta = dict(p.metadata)
        messages = p.prompt if isinstance(p.prompt, list) else [{"role": "user", "content": p.prompt}]
        row: dict[str, Any] = {"prompt": messages, "data_source": meta.pop("data_source", p.task_family)}
        row["ability"] = meta.pop("ability", "")
        row["reward_model"] = meta.pop("reward_model", {"style": "rule", "ground_truth": ""})
        extra = meta.pop("extra_info", {}) or {}
        row["extra_info"] = {**extra, "sapwood_task_id": p.task_id, "sapwood_metadata": json.dumps(meta)}
        out.append(row)
    pq.write_table(pa.Table.from_pylist(out), Path(path))
    return len(out)
