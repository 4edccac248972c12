"""verl Parquet datasets into a run's prompt queue and back out (no verl needed)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sapwood.adapters.verl.prompts import export_verl_parquet, import_verl_parquet
from sapwood.platform import runs
from sapwood.platform.errors import ValidationError
from sapwood.platform.prompts import prompt_progress
from sapwood.platform.store import Store

ROWS = [
    {"data_source": "openai/gsm8k", "prompt": [{"role": "user", "content": f"What is {i} + {i}?"}],
     "ability": "math", "reward_model": {"style": "rule", "ground_truth": str(2 * i)},
     "extra_info": {"index": i, "split": "train"}}
    for i in range(4)
]


def test_a_verl_dataset_round_trips_through_the_prompt_queue(tmp_path: Path) -> None:
    src = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist(ROWS), src)
    store = Store.open(f"sqlite:///{tmp_path / 'store.db'}")
    with store.transaction() as conn:
        runs.create_run(conn, "r", runs.ExecutionFilter(run_id="r"), kind="live", seed=0)
        assert import_verl_parquet(conn, "r", src, samples_per_prompt=2, epochs=1) == 8
        assert prompt_progress(conn, "r")[0]["pending"] == 8
        assert export_verl_parquet(conn, "r", tmp_path / "out.parquet") == 4
    back = pq.read_table(tmp_path / "out.parquet").to_pylist()
    for row, orig in zip(back, ROWS, strict=True):
        assert row["prompt"] == orig["prompt"]
        assert row["data_source"] == orig["data_source"]
        assert row["ability"] == orig["ability"]
        assert row["reward_model"] == orig["reward_model"]
        assert row["extra_info"]["index"] == orig["extra_info"]["index"]
        assert row["extra_info"]["sapwood_task_id"] == f"openai/gsm8k-{orig['extra_info']['index']}"


def test_a_row_without_a_prompt_is_refused_with_its_position(tmp_path: Path) -> None:
    src = tmp_path / "bad.parquet"
    pq.write_table(pa.Table.from_pylist([{"data_source": "x", "question": "no prompt column"}]), src)
    store = Store.open(f"sqlite:///{tmp_path / 'store.db'}")
    with store.transaction() as conn:
        runs.create_run(conn, "r", runs.ExecutionFilter(run_id="r"), kind="live", seed=0)
        with pytest.raises(ValidationError, match="row 0: a verl dataset row needs a 'prompt' column"):
            import_verl_parquet(conn, "r", src)
