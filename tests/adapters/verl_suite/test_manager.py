"""The ``sapwood`` agent-loop manager on verl's real AgentLoopManager and DataProto: group-aligned chunks, the
step / attempt stamps, and one execution per prompt group whatever the chunking would have cut."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import sqlalchemy as sa
import torch
from omegaconf import OmegaConf
from verl import DataProto
from verl.experimental.agent_loop.agent_loop import DictConfigWrap

import sapwood.adapters.verl.agent_loop as sapwood_loop
from sapwood.adapters.verl.agent_loop import SapwoodAgentLoop, policy_version_of
from sapwood.adapters.verl.manager import SapwoodAgentLoopManager, group_aligned_bounds
from sapwood.platform import schema
from sapwood.platform.execution_filter import ExecutionFilter
from sapwood.platform.storage.executions import executions_page
from sapwood.platform.store import Store
from tests.support.verl_engine import EngineServerManager


@pytest.mark.parametrize(("uids", "parts", "expected"), [
    (list("aabbcc"), 3, [(0, 2), (2, 4), (4, 6)]),  # verl's equal chunks already align
    (list("aaabbbccc"), 2, [(0, 3), (3, 9)]),  # verl would cut at 4 (inside group b): moved to the nearest edge
    (list("aabbbbcc"), 2, [(0, 2), (2, 8)]),  # a tie between two edges goes to the earlier one
    (list("ab"), 3, [(0, 1), (1, 1), (1, 2)]),  # fewer groups than parts: an empty range (verl chunks then)
    (list("a"), 1, [(0, 1)]),
    ([], 2, [(0, 0), (0, 0)]),
])
def test_bounds_cover_every_row_once_and_never_cut_a_group(uids: list[str], parts: int,
                                                          expected: list[tuple[int, int]]) -> None:
    bounds = group_aligned_bounds(uids, parts)
    assert bounds == expected
    assert [i for start, end in bounds for i in range(start, end)] == list(range(len(uids)))
    for start, _ in bounds:
        assert start in (0, len(uids)) or uids[start] != uids[start - 1]


def test_bounds_refuse_interleaved_groups_and_zero_parts() -> None:
    with pytest.raises(ValueError, match="rows of one uid are not contiguous"):
        group_aligned_bounds(list("aba"), 2)
    with pytest.raises(ValueError, match=r"number of agent-loop workers \(≥ 1\), got 0"):
        group_aligned_bounds(list("ab"), 0)


class InProcessWorker:
    """An agent-loop worker in this process: runs the ``sapwood`` loop over its chunk's rows, as verl's
    AgentLoopWorker does, and answers in the shape verl's manager reads (the Ray actor is what it stands for)."""

    def __init__(self, cfg: Any, tokenizer: Any, server: EngineServerManager) -> None:
        self.cfg, self.tokenizer, self.server = cfg, tokenizer, server
        self.chunks: list[list[str]] = []
        self.generate_sequences = SimpleNamespace(remote=self._generate)

    async def _generate(self, chunk: DataProto) -> DataProto:
        rows = len(chunk)
        self.chunks.append([str(u) for u in chunk.non_tensor_batch["uid"]])

        async def one(i: int) -> Any:
            kwargs = {k: v[i] for k, v in chunk.non_tensor_batch.items() if k not in ("agent_name", "priority")}
            loop = SapwoodAgentLoop(trainer_config=DictConfigWrap(self.cfg), server_manager=self.server,
                                    tokenizer=self.tokenizer, processor=None, dataset_cls=None,
                                    data_config=DictConfigWrap(self.cfg.data))
            return await loop.run({"temperature": 1.0}, **kwargs)

        outs = await asyncio.gather(*[one(i) for i in range(rows)])
        metric = {"generate_sequences": 0.0, "tool_calls": 0.0, "compute_score": 0.0, "num_preempted": 0}
        return DataProto.from_dict(
            tensors={"prompts": torch.zeros(rows, 4, dtype=torch.long),
                     "responses": torch.tensor([o.response_ids[:3] for o in outs], dtype=torch.long),
                     "attention_mask": torch.ones(rows, 7, dtype=torch.long)},
            non_tensors={"uid": chunk.non_tensor_batch["uid"]},
            meta_info={"metrics": [dict(metric) for _ in range(rows)]})


def _manager(tmp_path: Path, tokenizer: Any, workers: int) -> tuple[SapwoodAgentLoopManager, Any, list[Any]]:
    cfg = OmegaConf.create({
        "actor_rollout_ref": {"rollout": {"prompt_length": 32, "response_length": 16, "n": 3,
                                          "agent": {"num_workers": workers}}, "model": {}},
        "data": {},
        "sapwood": {"inner_agent": "single_turn_agent", "run_id": "verl-run",
                    "database_url": f"sqlite:///{tmp_path / 's.db'}"},
    })
    manager = SapwoodAgentLoopManager(cfg, llm_client=None)
    server = EngineServerManager()
    manager.agent_loop_workers = [InProcessWorker(cfg, tokenizer, server) for _ in range(workers)]
    return manager, cfg, manager.agent_loop_workers


def _batch(groups: int, n: int, step: int) -> DataProto:
    uids = np.array([f"uid{g}" for g in range(groups) for _ in range(n)], dtype=object)
    prompt = [{"role": "user", "content": "w1 w2 w3"}]
    raw = np.empty(len(uids), dtype=object)
    for i in range(len(uids)):
        raw[i] = prompt
    return DataProto.from_dict(non_tensors={"uid": uids, "raw_prompt": raw, "index": np.arange(len(uids)) // n},
                               meta_info={"global_steps": step, "validate": False})


def _executions(url: str) -> list[dict[str, Any]]:
    with Store.open(url).transaction() as conn:
        return [dict(r) for r in executions_page(conn, ExecutionFilter(run_id="verl-run"), after=None, limit=100)]


def test_a_group_verl_would_split_is_one_execution_with_the_step_and_attempt(tmp_path: Path,
                                                                           hf_tokenizer: Any) -> None:
    sapwood_loop._GROUPS.clear()
    manager, cfg, workers = _manager(tmp_path, hf_tokenizer, workers=3)
    batch = _batch(groups=4, n=3, step=5)  # 12 rows: verl's equal chunks (4 + 4 + 4) would split uid1 and uid2
    out = manager.generate_sequences(batch)
    sapwood_loop.recorder_for(cfg).flush()
    assert len(out) == 12
    chunks = [c for w in workers for c in w.chunks]
    assert [len(c) for c in chunks] == [3, 6, 3]
    for chunk in chunks:  # whole groups on each worker
        for uid in set(chunk):
            assert chunk.count(uid) == 3
    rows = _executions(cfg.sapwood.database_url)
    assert len(rows) == 4  # one execution per prompt group, none per split share
    assert {r["status"] for r in rows} == {"success"}
    assert {r["max_policy_version"] for r in rows} == {4}  # step 5 rolls out on the weights after 4 updates
    assert {r["n_calls"] for r in rows} == {3}  # one call per sample, on its own branch of the fork
    assert {r["n_forks"] for r in rows} == {1}
    assert {r["metadata"]["verl_step"] for r in rows} == {5}
    assert {r["metadata"]["verl_attempt"] for r in rows} == {manager.attempt}

def test_a_resumed_job_records_its_rerun_step_apart_from_what_the_killed_attempt_left(
        tmp_path: Path, hf_tokenizer: Any) -> None:
    """The killed attempt finished group uid0 and left uid1 half-done; the resumed attempt (a new manager)
    re-runs step 5: its executions are new ids, nothing conflicts, the half-done one stays unfinished."""
    sapwood_loop._GROUPS.clear()
    manager, cfg, _ = _manager(tmp_path, hf_tokenizer, workers=1)
    killed = manager.attempt
    rec = sapwood_loop.recorder_for(cfg)
    half = SapwoodAgentLoop(trainer_config=DictConfigWrap(cfg), server_manager=EngineServerManager(),
                            tokenizer=hf_tokenizer, processor=None, dataset_cls=None,
                            data_config=DictConfigWrap(cfg.data))
    # one of uid1's three samples ran before the kill: its execution never finishes
    asyncio.run(half.run({"temperature": 1.0}, raw_prompt=[{"role": "user", "content": "w1"}], uid="uid1",
                         sapwood_step=5, sapwood_attempt=killed, sapwood_group_size=3))
    sapwood_loop._GROUPS.clear()  # the process died
    resumed, _, _ = _manager(tmp_path, hf_tokenizer, workers=1)
    assert resumed.attempt != killed
    resumed.generate_sequences(_batch(groups=2, n=3, step=5))
    rec.flush()
    rows = _executions(cfg.sapwood.database_url)
    assert len(rows) == 3
    assert sorted(r["status"] for r in rows) == ["running", "success", "success"]
    assert {r["metadata"]["verl_attempt"] for r in rows if r["status"] == "success"} == {resumed.attempt}
    assert [r["metadata"]["verl_attempt"] for r in rows if r["status"] == "running"] == [killed]
    with Store.open(cfg.sapwood.database_url).transaction() as conn:
        dead = conn.execute(sa.select(sa.func.count()).select_from(schema.dead_letters)).scalar_one()
    assert dead == 0  # nothing conflicted with what the killed attempt stored

@pytest.mark.parametrize(("kwargs", "version"), [
    ({"sapwood_step": 1}, 0),  # the first step rolls out on the initial weights
    ({"sapwood_step": 7}, 6),
    ({"sapwood_step": 7, "global_steps": 3}, 3),  # a row's own field wins
    ({"sapwood_step": 7, "sapwood_policy_version": 2}, 2),
])
def test_policy_version_from_the_stamped_step(kwargs: dict[str, Any], version: int) -> None:
    assert policy_version_of(kwargs) == version


def test_policy_version_without_a_step_is_the_set_value() -> None:
    sapwood_loop.set_policy_version(9)
    try:
        assert policy_version_of({}) == 9
        assert policy_version_of({"sapwood_step": -1}) == 9
        assert policy_version_of({"sapwood_step": 0}) == 9  # verl's step 0 is before any rollout
    finally:
        sapwood_loop.set_policy_version(0)
