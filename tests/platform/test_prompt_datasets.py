"""``sapwood runs add-prompts``: JSONL, Parquet and saved ``datasets`` folders; text or chat prompts; clear errors."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from sapwood.platform.cli import app
from sapwood.platform.errors import ValidationError
from sapwood.platform.prompts import prompt_progress, read_dataset
from sapwood.platform.store import Store

ROWS = [
    {"prompt": "What is 2 + 2?", "task_id": "add-1", "task_family": "math", "answer": "4"},
    {"prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Capital of France?"}],
     "metadata": {"source": "geo"}},
]


def _saved_dataset(folder: Path, rows: list[dict]) -> Path:
    """The layout ``datasets.Dataset.save_to_disk`` writes: Arrow stream files named in state.json."""
    folder.mkdir()
    table = pa.Table.from_pylist(rows)
    with pa.OSFile(str(folder / "data-00000-of-00001.arrow"), "wb") as sink, pa.ipc.new_stream(sink,
                                                                                            table.schema) as w:
        w.write_table(table)
    (folder / "state.json").write_text(json.dumps({"_data_files": [{"filename": "data-00000-of-00001.arrow"}],
                                                   "_split": "train"}))
    (folder / "dataset_info.json").write_text("{}")
    return folder


def test_the_three_formats_read_the_same_prompts(tmp_path: Path) -> None:
    jsonl = tmp_path / "d.jsonl"
    jsonl.write_text("\n".join(json.dumps(r) for r in ROWS) + "\n")
    parquet = tmp_path / "d.parquet"
    uniform = [{"prompt": r["prompt"] if isinstance(r["prompt"], str) else "x"} for r in ROWS]
    pq.write_table(pa.Table.from_pylist(uniform), parquet)
    folder = _saved_dataset(tmp_path / "saved", uniform)
    rows = read_dataset(jsonl)
    assert rows[0].task_id == "add-1"
    assert rows[0].task_family == "math"
    assert rows[0].metadata == {"answer": "4"}
    assert rows[1].prompt[1] == {"role": "user", "content": "Capital of France?"}
    assert rows[1].task_id == "prompt-1"
    assert rows[1].task_family == "default"
    assert rows[1].metadata == {"source": "geo"}
    assert [r.prompt for r in read_dataset(parquet)] == [r.prompt for r in read_dataset(folder)] == ["What is 2 + 2?",
                                                                                                     "x"]
    with pytest.raises(ValidationError, match="splits"):
        (folder.parent / "dd").mkdir()
        (folder.parent / "dd" / "dataset_dict.json").write_text(json.dumps({"splits": ["test"]}))
        read_dataset(folder.parent / "dd")


@pytest.mark.parametrize(("line", "message"), [
    ('{"question": "no prompt"}', "no 'prompt' column"),
    ('{"prompt": [{"role": "user"}]}', "message 0 must be an object"),
    ('{"prompt": 3}', "must be text or a non-empty list"),
    ('{"prompt": "x", "metadata": [1]}', "'metadata' must be an object"),
    ("not json", "not JSON"),
])
def test_bad_rows_say_what_was_wrong(tmp_path: Path, line: str, message: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(line + "\n")
    with pytest.raises(ValidationError, match=message):
        read_dataset(path)


def test_add_prompts_cli_queues_samples_per_epoch_and_stats_shows_them(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"
    data = tmp_path / "d.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in ROWS))
    result = CliRunner().invoke(app, ["runs", "add-prompts", "rl-1", "--from", str(data), "--samples-per-prompt",
                                      "2", "--epochs", "3", "--database-url", url])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output.strip().splitlines()[-1]) == {"run": "rl-1", "prompts": 2, "samples": 12}
    store = Store.open(url)
    with store.transaction() as conn:
        assert prompt_progress(conn, "rl-1") == {e: {"pending": 4, "claimed": 0, "done": 0, "abandoned": 0}
                                                 for e in range(3)}
    stats = CliRunner().invoke(app, ["stats", "--database-url", url])
    assert stats.exit_code == 0
    assert "Prompt queues" in stats.output
    assert "rl-1" in stats.output
    bad = CliRunner().invoke(app, ["runs", "add-prompts", "rl-1", "--from", str(tmp_path / "nope.jsonl"),
                                   "--database-url", url])
    assert bad.exit_code == 2
    assert "does not exist" in " ".join(bad.output.split())
