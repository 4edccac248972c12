"""Retokenization drift: did the previous chat turn's output ids come back verbatim in the next prompt?

A chat harness sends the assistant's answer back as text; the server's chat template renders it and
tokenizes it again. When that round trip changes the ids, the next prompt no longer continues the
previous context (what the model was trained to see is not what it saw). For a chat call whose prompt
starts with the previous call's prompt (the same conversation, one turn on), the previous output ids
[n] must follow verbatim; the first position in the new prompt where they do not is the drift. A prompt
that does not start with the previous prompt (a fork, a compaction), or is that prompt again (another
sample from the same state), is not checked.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sapwood.gateway.tree import Ids, as_ids, common_prefix_len


@dataclass(frozen=True)
class DriftCheck:
    """``checked``: the prompt continued the previous prompt; ``position``: index in the new prompt of
    the first id that differs from the previous output (None: no drift)."""

    checked: bool
    position: int | None = None


def check_drift(prev_prompt: Ids, prev_output: Ids, prompt: Ids) -> DriftCheck:
    """Whether ``prev_output`` follows ``prev_prompt`` verbatim at the start of ``prompt`` (see the module doc)."""
    before, out, now = as_ids(prev_prompt), as_ids(prev_output), as_ids(prompt)
    if len(out) == 0 or len(now) <= len(before) or not np.array_equal(now[: len(before)], before):
        return DriftCheck(False)
    same = common_prefix_len(now[len(before):], out)
    return DriftCheck(True, None if same == len(out) else len(before) + same)


__all__ = ["DriftCheck", "check_drift"]
