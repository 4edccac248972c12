"""Sapwood history as verl's DataProto, trained with verl's own GRPO advantage and PPO policy loss."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from verl import DataProto
from verl.trainer.ppo import core_algos
from verl.workers.config.actor import ActorConfig

from sapwood.adapters.verl.data_proto import rows_to_data_proto
from sapwood.adapters.verl.rows import TrajectoryRow, trajectory_rows
from sapwood.learner.assembly import build_batch
from sapwood.learner.config import SourceConfig
from sapwood.platform.store import Store
from tests.support.verl_trees import record_group


def _row(prompt: int, response: int, *, reward: float = 1.0, eid: str = "e") -> TrajectoryRow:
    return TrajectoryRow(list(range(1, prompt + 1)), list(range(10, 10 + response)), [1] * response,
                         [-0.5] * response, reward, eid, "f", 0)


def test_fields_shapes_padding_and_the_reward_on_the_last_response_token() -> None:
    proto, cut = rows_to_data_proto([_row(3, 2, reward=0.7), _row(4, 4, reward=0.1)], prompt_length=4,
                                    response_length=4, pad_token_id=0)
    assert isinstance(proto, DataProto)
    b = proto.batch
    assert b["prompts"].tolist() == [[0, 1, 2, 3], [1, 2, 3, 4]]  # left-padded
    assert b["responses"].tolist() == [[10, 11, 0, 0], [10, 11, 12, 13]]  # right-padded
    assert b["attention_mask"].tolist() == [[0, 1, 1, 1, 1, 1, 0, 0], [1] * 8]
    assert b["position_ids"].tolist()[0] == [0, 0, 1, 2, 3, 4, 4, 4]
    assert b["response_mask"].tolist() == [[1, 1, 0, 0], [1, 1, 1, 1]]
    assert b["token_level_scores"][0].tolist() == pytest.approx([0, 0.7, 0, 0])
    assert b["token_level_scores"][1].tolist() == pytest.approx([0, 0, 0, 0.1])
    assert b["input_ids"].shape == (2, 8)
    assert list(proto.non_tensor_batch["uid"]) == ["e", "e"]
    assert cut.prompts_truncated == 0  # exactly at both lengths: nothing cut
    assert cut.responses_truncated == 0


def test_one_token_over_each_length_is_cut_and_counted() -> None:
    _, cut = rows_to_data_proto([_row(5, 5)], prompt_length=4, response_length=4)
    assert (cut.prompts_truncated, cut.prompt_tokens_cut) == (1, 1)
    assert (cut.responses_truncated, cut.response_tokens_cut, cut.trained_tokens_cut) == (1, 1, 1)
    proto, _ = rows_to_data_proto([_row(5, 5)], prompt_length=4, response_length=4)
    assert proto.batch["prompts"].tolist() == [[2, 3, 4, 5]]  # the prompt keeps its last tokens
    assert proto.batch["responses"].tolist() == [[10, 11, 12, 13]]  # the response its first


def test_bad_lengths_and_empty_selections_are_refused() -> None:
    with pytest.raises(ValueError, match="prompt_length and response_length must be ≥ 1"):
        rows_to_data_proto([_row(1, 1)], prompt_length=0, response_length=4)
    with pytest.raises(ValueError, match="no rows"):
        rows_to_data_proto([], prompt_length=4, response_length=4)


class Bigram(torch.nn.Module):
    """log π(token | previous token): the smallest causal LM."""

    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.logits = torch.nn.Embedding(vocab, vocab)

    def response_logprobs(self, input_ids: torch.Tensor, response_length: int) -> torch.Tensor:
        logp = torch.log_softmax(self.logits(input_ids[:, :-1]), dim=-1)
        token = logp.gather(-1, input_ids[:, 1:, None]).squeeze(-1)
        return token[:, -response_length:]


def test_an_exported_batch_trains_with_verls_grpo_advantage_and_ppo_loss(tmp_path: Path) -> None:
    store = Store.open(f"sqlite:///{tmp_path / 'store.db'}")
    ids = [record_group(store, "r", f"t{i}", samples=4, turns=2, seed=i)[0] for i in range(3)]
    batch, used = build_batch(store, ids, SourceConfig(jmax=8))
    assert sorted(used) == sorted(ids)
    rows, _ = trajectory_rows(batch)
    proto, cut = rows_to_data_proto(rows, prompt_length=8, response_length=16)
    assert cut.trained_tokens_cut == 0
    b = proto.batch
    adv, _returns = core_algos.compute_grpo_outcome_advantage(
        token_level_rewards=b["token_level_scores"], response_mask=b["response_mask"],
        index=proto.non_tensor_batch["uid"])
    assert adv.shape == b["responses"].shape
    assert torch.isfinite(adv).all()
    # within a group (one execution), rewards 0, 1/4, 2/4, 3/4 give advantages of both signs
    assert (adv[b["response_mask"].bool()] > 0).any()
    assert (adv[b["response_mask"].bool()] < 0).any()
    config = ActorConfig(strategy="fsdp", ppo_micro_batch_size_per_gpu=1, use_dynamic_bsz=False, rollout_n=4)
    torch.manual_seed(0)
    model = Bigram(50)
    opt = torch.optim.Adam(model.parameters(), lr=0.05)
    r = b["responses"].shape[1]
    losses = []
    for _ in range(5):
        log_prob = model.response_logprobs(b["input_ids"], r)
        loss, _ = core_algos.compute_policy_loss_vanilla(
            old_log_prob=b["rollout_log_probs"], log_prob=log_prob, advantages=adv,
            response_mask=b["response_mask"].float(), loss_agg_mode="token-mean", config=config)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    assert np.all(np.isfinite(losses))
    assert losses[-1] < losses[0]
