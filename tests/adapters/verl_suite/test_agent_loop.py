"""verl's real agent loops (single_turn_agent, and a two-turn loop on verl's AgentLoopBase) recorded through
the ``sapwood`` loop: what the loop returns to verl is untouched, and the store holds exactly those calls."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from omegaconf import OmegaConf
from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopOutput, DictConfigWrap, register

import sapwood.adapters.verl.agent_loop as sapwood_loop
from sapwood.adapters.verl.agent_loop import SapwoodAgentLoop
from sapwood.api.queries.audit import audit
from sapwood.platform.storage.backends import tree_reader
from sapwood.platform.store import Store
from tests.support.verl_engine import EngineServerManager, VllmServerManager


@register("two_turn_test")
class TwoTurnLoop(AgentLoopBase):
    """Generate, append a tool observation, generate again (the shape of verl's tool agent)."""

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        prompt = await self.ct_build_initial_tokens(list(kwargs["raw_prompt"]))
        first = await self.server_manager.generate(request_id="a", prompt_ids=prompt, sampling_params=sampling_params)
        observation = [4, 20, 21, 5]  # <|tool|> w14 w15 <|end|>
        context = prompt + first.token_ids + observation
        second = await self.server_manager.generate(request_id="b", prompt_ids=context,
                                                    sampling_params=sampling_params)
        response = first.token_ids + observation + second.token_ids
        return AgentLoopOutput(prompt_ids=prompt, response_ids=response,
                               response_mask=[1] * len(first.token_ids) + [0] * 4 + [1] * len(second.token_ids),
                               response_logprobs=first.log_probs + [0.0] * 4 + second.log_probs,
                               reward_score=float(len(second.token_ids)), num_turns=4, metrics={})


def _config(tmp_path: Path, inner: str, n: int) -> Any:
    return OmegaConf.create({
        "actor_rollout_ref": {"rollout": {"prompt_length": 32, "response_length": 16, "n": n}},
        "data": {},
        "sapwood": {"inner_agent": inner, "run_id": "verl-run", "database_url": f"sqlite:///{tmp_path / 's.db'}"},
    })


async def _play(cfg: Any, tokenizer: Any, manager: Any, n: int) -> list[AgentLoopOutput]:
    def make() -> SapwoodAgentLoop:
        return SapwoodAgentLoop(trainer_config=DictConfigWrap(cfg), server_manager=manager, tokenizer=tokenizer,
                                processor=None, dataset_cls=None, data_config=DictConfigWrap(cfg.data))

    prompt = [{"role": "user", "content": "w1 w2 w3"}]
    return list(await asyncio.gather(*[make().run({"temperature": 1.0}, raw_prompt=prompt, uid="u1")
                                       for _ in range(n)]))


def _stored_calls(url: str) -> tuple[list[dict[str, Any]], Any]:
    store = Store.open(url)
    with store.transaction() as conn:
        from sapwood.platform.execution_filter import ExecutionFilter
        from sapwood.platform.storage.executions import executions_page

        page = executions_page(conn, ExecutionFilter(run_id="verl-run"), after=None, limit=10)
        assert len(page) == 1  # the n samples of one prompt are ONE execution
        eid = str(page[0]["execution_id"])
        reader = tree_reader(conn)
        nodes = reader.nodes(conn, eid)
        calls = []
        for node in nodes:
            if node.call_id is None or node.role != 2:  # action outputs
                continue
            ctx = reader.context_tokens(conn, node.node_id).tolist()
            calls.append({"context": ctx, "length": node.length,
                          "audit": audit(conn, str(node.call_id), tokenizer=None)})
        return calls, page[0]


def _server(kind: str) -> Any:
    """Sapwood's local engine always; the real vLLM CPU server when one is up (SAPWOOD_TEST_VLLM_URL)."""
    if kind == "engine":
        return EngineServerManager()
    url = os.environ.get("SAPWOOD_TEST_VLLM_URL")
    if not url:
        pytest.skip("SAPWOOD_TEST_VLLM_URL is unset (python scripts/services.py start vllm)")
    return VllmServerManager(url)


@pytest.mark.parametrize("server", ["engine", "vllm"])
@pytest.mark.parametrize("inner,n,calls_per_sample", [("single_turn_agent", 2, 1), ("two_turn_test", 3, 2)])
def test_every_call_is_recorded_once_with_exact_ids_and_the_loop_output_is_unchanged(
        tmp_path: Path, hf_tokenizer: Any, inner: str, n: int, calls_per_sample: int, server: str) -> None:
    sapwood_loop._GROUPS.clear()
    cfg = _config(tmp_path, inner, n)
    manager = _server(server)
    outputs = asyncio.run(_play(cfg, hf_tokenizer, manager, n))
    sapwood_loop.recorder_for(cfg).flush()
    assert len(manager.answers) == n * calls_per_sample
    for out in outputs:  # what verl gets is the inner loop's own output
        assert out.response_mask.count(1) == 3 * calls_per_sample
    calls, row = _stored_calls(cfg.sapwood.database_url)
    # each engine answer is stored once: its exact prompt ids then output ids form a stored context
    stored = sorted(c["context"] for c in calls)
    answered = sorted(p + o for p, o, _ in manager.answers)
    assert stored == answered
    # every call's audit verifies its input digest and gives back the engine's exact answer
    assert [c["audit"]["verified"] for c in calls] == [True] * len(calls)
    audited = sorted((c["audit"]["input"]["token_ids"].tolist(), c["audit"]["output"]["token_ids"].tolist(),
                      c["audit"]["output"]["logprobs"].tolist()) for c in calls)
    expected = sorted(manager.answers)
    assert [(p, o) for p, o, _ in audited] == [(p, o) for p, o, _ in expected]
    for (_, _, got), (_, _, want) in zip(audited, expected, strict=True):
        assert got == pytest.approx(want, abs=1e-6)
    assert row["status"] == "success"
    if inner == "two_turn_test":
        assert row["reward"] == pytest.approx(3.0)  # every sample scored 3 (its second call's length)
    else:
        assert row["reward"] is None  # single_turn_agent scores nothing: verl's reward manager does later
    assert np.isfinite([lp for _, _, lps in manager.answers for lp in lps]).all()


def test_an_inner_loop_that_is_not_registered_is_refused(tmp_path: Path, hf_tokenizer: Any) -> None:
    cfg = _config(tmp_path, "no_such_loop", 1)

    async def make() -> None:
        SapwoodAgentLoop(trainer_config=DictConfigWrap(cfg), server_manager=EngineServerManager(),
                         tokenizer=hf_tokenizer, processor=None, dataset_cls=None, data_config=DictConfigWrap(cfg.data))

    with pytest.raises(ValueError, match=r"sapwood\.inner_agent='no_such_loop' is not another registered agent loop"):
        asyncio.run(make())
