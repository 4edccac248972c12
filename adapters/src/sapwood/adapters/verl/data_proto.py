"""Trajectory rows as verl's ``DataProto``, with the fields verl's PPO / GRPO trainer reads.

Per row (``B`` rows, prompt length ``P``, response length ``R``):

- ``prompts`` [B, P] int64, left-padded with ``pad_token_id``; ``responses`` [B, R] int64, right-padded;
- ``input_ids`` [B, P + R] = prompts ‖ responses; ``attention_mask`` [B, P + R] int64 (1 on real tokens);
  ``position_ids`` [B, P + R] int64 (verl's rule: cumulative sum of the mask − 1, clipped at 0);
- ``response_mask`` [B, R] int64 (1 on trained model output); ``rollout_log_probs`` [B, R] float32;
- ``token_level_scores`` [B, R] float32: the reward on the last real response token (verl's reward
  managers put an outcome score there), 0 elsewhere;
- non-tensor ``uid`` [B] object: the group a row's advantage is normalised in (GRPO): the execution id
  (forks of one prompt are one execution) or the task id;
- ``meta_info["sapwood"]``: execution ids and what was cut (:class:`Cut`).

A prompt longer than ``P`` keeps its last ``P`` tokens; a response longer than ``R`` keeps its first ``R``
(verl's own truncation sides); both are counted, never silent.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

import numpy as np
import torch
from verl import DataProto
from verl.utils.model import compute_position_id_with_mask

from sapwood.adapters.verl.rows import TrajectoryRow

__all__ = ["Cut", "rows_to_data_proto"]


@dataclass
class Cut:
    """What padding to verl's fixed lengths cut off."""

    rows: int = 0
    prompts_truncated: int = 0
    prompt_tokens_cut: int = 0
    responses_truncated: int = 0
    response_tokens_cut: int = 0
    trained_tokens_cut: int = 0
    """Response tokens with mask 1 that were cut (their gradient is lost)."""


def rows_to_data_proto(rows: Sequence[TrajectoryRow], *, prompt_length: int, response_length: int,
                       pad_token_id: int = 0, group_by: Literal["execution", "task"] = "execution",
                       task_ids: dict[str, str] | None = None) -> tuple[DataProto, Cut]:
    """Pad and stack ``rows``; ``task_ids`` (execution id → task id) is needed for ``group_by="task"``."""
    if prompt_length < 1 or response_length < 1:
        raise ValueError(f"prompt_length and response_length must be ≥ 1, got {prompt_length}, {response_length}")
    if not rows:
        raise ValueError("no rows: the selection holds no trainable trajectory")
    if group_by == "task" and task_ids is None:
        raise ValueError("group_by='task' needs task_ids (execution id → task id)")
    b, p, r = len(rows), prompt_length, response_length
    prompts = torch.full((b, p), pad_token_id, dtype=torch.int64)
    responses = torch.full((b, r), pad_token_id, dtype=torch.int64)
    prompt_mask = torch.zeros((b, p), dtype=torch.int64)
    response_real = torch.zeros((b, r), dtype=torch.int64)
    response_mask = torch.zeros((b, r), dtype=torch.int64)
    logprobs = torch.zeros((b, r), dtype=torch.float32)
    scores = torch.zeros((b, r), dtype=torch.float32)
    cut = Cut(rows=b)
    for i, row in enumerate(rows):
        prompt = row.prompt_ids[-p:]
        if len(row.prompt_ids) > p:
            cut.prompts_truncated += 1
            cut.prompt_tokens_cut += len(row.prompt_ids) - p
        if prompt:
            prompts[i, p - len(prompt):] = torch.tensor(prompt, dtype=torch.int64)
            prompt_mask[i, p - len(prompt):] = 1
        n = min(len(row.response_ids), r)
        if len(row.response_ids) > r:
            cut.responses_truncated += 1
            cut.response_tokens_cut += len(row.response_ids) - r
            cut.trained_tokens_cut += sum(row.response_mask[r:])
        responses[i, :n] = torch.tensor(row.response_ids[:n], dtype=torch.int64)
        response_real[i, :n] = 1
        response_mask[i, :n] = torch.tensor(row.response_mask[:n], dtype=torch.int64)
        logprobs[i, :n] = torch.tensor(row.rollout_log_probs[:n], dtype=torch.float32)
        scores[i, n - 1] = row.reward
    attention_mask = torch.cat([prompt_mask, response_real], dim=1)
    if group_by == "execution":
        uid = [row.execution_id for row in rows]
    else:
        assert task_ids is not None
        uid = [task_ids[row.execution_id] for row in rows]
    meta: dict[str, Any] = {"sapwood": {"execution_ids": sorted({row.execution_id for row in rows}),
                                        "cut": asdict(cut)}}
    proto = DataProto.from_dict(
        tensors={"prompts": prompts, "responses": responses, "input_ids": torch.cat([prompts, responses], dim=1),
                 "attention_mask": attention_mask, "position_ids": compute_position_id_with_mask(attention_mask),
                 "response_mask": response_mask, "rollout_log_probs": logprobs, "token_level_scores": scores},
        non_tensors={"uid": np.array(uid, dtype=object)},
        meta_info=meta,
    )
    return proto, cut
