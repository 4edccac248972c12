"""Key recall: a synthetic long-horizon task family that a tiny model can learn on CPU.

The task prompt shows a hidden key of K distinct symbols. Each turn the agent emits one
token, the next symbol of the key; the tool grades it and answers with an observation
``[verdict, noise, noise, ref]``: ``OK``/``WRONG``/``INVALID``, two noise tokens, and
``ref``, the key symbol of the slot just graded (a progress marker, like a test log naming
the last test). A wrong symbol uses up its slot; a token that is not a symbol is
``INVALID`` and wastes the turn without advancing.

The context window is small (64 tokens by default): after a few turns the harness asks
the model for a summary (``SUM_REQ``), and the next segment starts from a short
instruction plus that summary only — the key is gone. A summary that copies the key
symbols not yet emitted is what lets later segments keep succeeding; a summary that drops
or garbles them leaves later actions guessing. So the summary is a decision with
consequences, trained with the same reward as the actions (CompactionRL).

Reward = fraction of the key's slots emitted correctly. A trajectory has a turn budget
(action calls); when it runs out before the key is done the execution times out and the
scorer grades the checkable partial progress (slots correct / K), which becomes its reward.

Token layout (``KeyRecallConfig`` defaults: 16 symbols, 32 noise tokens, vocab 64)::

    0 PAD  1 BOS  2 TASK  3 KEY_OPEN  4 KEY_CLOSE  5 MEM_OPEN  6 MEM_CLOSE  7 SUM_REQ
    8 SUM_END  9 OK  10 WRONG  11 INVALID  12 NONE  13 CONT  14 FORK  15 spare
    16 … 16+n_symbols-1 symbols;  then n_noise noise tokens

Contexts (``fixed_layout``: the list is padded to ``max_key`` slots)::

    segment 0:  BOS TASK KEY_OPEN s_0 … s_{K-1} PAD… KEY_CLOSE  (a obs)*  [SUM_REQ → summary END]
    segment k:  BOS CONT MEM_OPEN summary…      PAD… MEM_CLOSE  (a obs)*  [SUM_REQ → summary END]

With the defaults (64-token window, 5 tokens per turn, 16 reserved for the summary) a
segment holds 6 turns, so a key of 7–14 symbols needs a compaction, and keys of 13–14 always
run out of the 12-turn budget (timeouts graded by partial progress), as does any trajectory
that wastes turns on invalid actions.

Why a tiny model can learn it: the list always sits at the same positions and every turn
adds the same number of tokens, so "the next symbol" is the list slot at a position fixed by
the number of graded turns, and a summary copies the slots from there to the end of the list
(then ``SUM_END``) — positional look-ups that two attention layers learn in a few hundred
supervised steps (without padding an induction head is needed, which takes much longer).
An invalid action breaks that arithmetic (the slot does not advance), so the ``ref`` in the
observation is also there to re-synchronise on. An untrained policy emits random tokens,
mostly invalid (reward ≈ 0); the demo's policy starts from brief supervised pre-training on
imperfect demonstrations (:func:`teacher_action`, :func:`teacher_summary`), which leaves RL
room to improve both the actions and the summaries.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import numpy as np

from sapwood.platform.errors import ValidationError

__all__ = [
    "BOS",
    "CONT",
    "FORK",
    "INVALID",
    "KEY_CLOSE",
    "KEY_OPEN",
    "MEM_CLOSE",
    "MEM_OPEN",
    "NONE",
    "OK",
    "PAD",
    "SUM_END",
    "SUM_REQ",
    "SYMBOL_BASE",
    "TASK",
    "TOKEN_NAMES",
    "WRONG",
    "BranchState",
    "DemoNoise",
    "KeyRecallConfig",
    "KeyRecallEnv",
    "KeyTask",
    "render",
    "teacher_action",
    "teacher_summary",
]

PAD, BOS, TASK, KEY_OPEN, KEY_CLOSE, MEM_OPEN, MEM_CLOSE, SUM_REQ = 0, 1, 2, 3, 4, 5, 6, 7
SUM_END, OK, WRONG, INVALID, NONE, CONT = 8, 9, 10, 11, 12, 13
FORK = 14
"""An action (with ``policy_forks``) that forks the trajectory: it uses a turn, the tool answers
``FORK``, and the harness continues ``fork_branches`` ways from there."""
SYMBOL_BASE = 16
TOKEN_NAMES = {
    PAD: "PAD", BOS: "BOS", TASK: "TASK", KEY_OPEN: "KEY[", KEY_CLOSE: "]KEY", MEM_OPEN: "MEM[",
    MEM_CLOSE: "]MEM", SUM_REQ: "SUMMARIZE", SUM_END: "END", OK: "OK", WRONG: "WRONG", INVALID: "INVALID",
    NONE: "NONE", CONT: "CONT", FORK: "FORK",
}


@dataclass(frozen=True)
class KeyRecallConfig:
    """Shape of the key-recall task family."""

    n_symbols: int = 16
    """Distinct key symbols (a key never repeats a symbol, so K ≤ n_symbols)."""
    n_noise: int = 32
    """Noise tokens the tool mixes into observations."""
    min_key: int = 6
    """Shortest key."""
    max_key: int = 14
    """Longest key; keys longer than ``max_turns`` always time out (partial score)."""
    context_limit: int = 64
    """Tokens one model context may hold, summary output included (compaction trigger)."""
    max_turns: int = 12
    """Turn budget: action calls per trajectory before it times out."""
    noise_per_observation: int = 2
    """Noise tokens in each observation."""
    max_summary_tokens: int = 15
    """Most tokens a summary call may generate (``max_key + 1`` lets a summary keep every symbol)."""
    fork_prob: float = 0.2
    """Probability that an execution forks: one action turn resampled ``fork_branches`` ways."""
    fork_branches: int = 2
    """Branches of a fork (each continues to its own end: a trajectory)."""
    policy_forks: int = 0
    """Forks the policy may choose on each trajectory by emitting ``FORK`` (each costs a turn of
    every branch's budget and earns nothing by itself); 0: ``FORK`` is an invalid action."""
    fixed_layout: bool = True
    """Pad the key and the summary to ``max_key`` slots with ``PAD`` so every segment's list
    starts and ends at the same positions (a tiny model with learned absolute positions then
    finds the slot by position; without padding it must learn an induction head first)."""

    def __post_init__(self) -> None:
        if not 1 <= self.min_key <= self.max_key <= self.n_symbols:
            raise ValidationError(
                f"need 1 ≤ min_key ≤ max_key ≤ n_symbols, got {self.min_key}, {self.max_key}, {self.n_symbols}"
            )
        if self.max_turns < 1 or self.n_noise < 1 or self.noise_per_observation < 0:
            raise ValidationError("max_turns and n_noise must be ≥ 1, noise_per_observation ≥ 0")
        if self.fork_branches < 2 or not 0.0 <= self.fork_prob <= 1.0:
            raise ValidationError("fork_branches must be ≥ 2 and fork_prob in [0, 1]")
        if self.policy_forks < 0:
            raise ValidationError(f"policy_forks must be ≥ 0, got {self.policy_forks}")
        longest_prompt = self.max_key + 4
        if longest_prompt + self.turn_tokens + self.summary_reserve > self.context_limit:
            raise ValidationError(
                f"context_limit {self.context_limit} is too small: the longest prompt ({longest_prompt}) plus one "
                f"turn ({self.turn_tokens}) plus the summary reserve ({self.summary_reserve}) must fit"
            )
        if 4 + self.max_summary_tokens + self.turn_tokens + self.summary_reserve > self.context_limit:
            raise ValidationError("context_limit too small for a compacted context plus one turn and a summary")

    @property
    def vocab_size(self) -> int:
        """Number of token ids."""
        return SYMBOL_BASE + self.n_symbols + self.n_noise

    @property
    def observation_tokens(self) -> int:
        """Tokens of one observation: verdict, noise, ref."""
        return 2 + self.noise_per_observation

    @property
    def turn_tokens(self) -> int:
        """Tokens one turn adds to the context: a 1-token action and its observation."""
        return 1 + self.observation_tokens

    @property
    def summary_reserve(self) -> int:
        """Room kept free for the summary request and the summary itself."""
        return 1 + self.max_summary_tokens

    def symbol(self, i: int) -> int:
        """Token id of symbol ``i``."""
        return SYMBOL_BASE + i

    def is_symbol(self, token: int) -> bool:
        return SYMBOL_BASE <= token < SYMBOL_BASE + self.n_symbols

    @property
    def noise_base(self) -> int:
        return SYMBOL_BASE + self.n_symbols


@dataclass(frozen=True)
class KeyTask:
    """One task: its id and key (symbol token ids, distinct)."""

    task_id: str
    key: tuple[int, ...]

    @property
    def length(self) -> int:
        return len(self.key)


@dataclass
class BranchState:
    """Environment state of one trajectory (copied at a fork: the state belongs to the execution)."""

    task: KeyTask
    context: list[int]
    """Token ids of the current segment's context (what the next call sees, before any request token)."""
    visible: list[int]
    """The list shown in the current context: the key (segment 0) or the summary's tokens."""
    slot: int = 0
    """Next key slot to grade."""
    correct: int = 0
    turns: int = 0
    """Action calls used (the turn budget counts these)."""
    cursor: int = 0
    """Graded actions in the current segment (index into ``visible`` for the demonstrator)."""
    segment: int = 0
    summaries: int = 0
    invalid: int = 0
    forks: int = 0
    """Forks the policy chose on this trajectory (``FORK`` actions)."""
    graded: list[bool] = field(default_factory=list)
    """Per graded slot: correct or not."""
    summary_recall: list[float] = field(default_factory=list)
    """Per compaction: fraction of the not-yet-graded key slots the summary kept, in place."""

    @property
    def done(self) -> bool:
        return self.slot >= self.task.length

    def copy(self) -> BranchState:
        return copy.deepcopy(self)


class KeyRecallEnv:
    """Task sampler, tool, compaction harness and scorer of the key-recall family."""

    def __init__(self, config: KeyRecallConfig | None = None) -> None:
        self.config = config or KeyRecallConfig()

    # -- tasks ------------------------------------------------------------------------------------
    def sample_task(self, rng: np.random.Generator, task_id: str | None = None) -> KeyTask:
        """A random key of ``min_key..max_key`` distinct symbols."""
        c = self.config
        k = int(rng.integers(c.min_key, c.max_key + 1))
        key = tuple(c.symbol(int(s)) for s in rng.permutation(c.n_symbols)[:k])
        return KeyTask(task_id or f"key-{k}-" + "".join(f"{s - SYMBOL_BASE:x}" for s in key), key)

    def prompt(self, task: KeyTask) -> list[int]:
        """Segment 0's context: ``BOS TASK KEY_OPEN key… KEY_CLOSE``."""
        return [BOS, TASK, KEY_OPEN, *self._pad(list(task.key)), KEY_CLOSE]

    def _pad(self, items: list[int]) -> list[int]:
        c = self.config
        return items + [PAD] * (c.max_key - len(items)) if c.fixed_layout else items

    def reset(self, task: KeyTask) -> BranchState:
        return BranchState(task=task, context=self.prompt(task), visible=list(task.key))

    # -- harness ----------------------------------------------------------------------------------
    def needs_summary(self, state: BranchState) -> bool:
        """True when one more turn would not leave room for the summary request and summary."""
        c = self.config
        return len(state.context) + c.turn_tokens + c.summary_reserve > c.context_limit

    def summary_input(self, state: BranchState) -> list[int]:
        """Input of the summary call: the context plus the ``SUM_REQ`` instruction."""
        return [*state.context, SUM_REQ]

    def compact(self, state: BranchState, summary_output: list[int]) -> list[int]:
        """Start the next segment from the summary; returns the new context (also set on ``state``).

        The summary is the output up to (not including) ``SUM_END``, at most ``max_summary_tokens``.
        """
        c = self.config
        body = list(summary_output)
        if SUM_END in body:
            body = body[: body.index(SUM_END)]
        body = body[: c.max_summary_tokens]
        if c.fixed_layout:
            body = body[: c.max_key]
        rest = state.task.key[state.slot :]
        if rest:
            state.summary_recall.append(sum(a == b for a, b in zip(body, rest, strict=False)) / len(rest))
        state.context = [BOS, CONT, MEM_OPEN, *self._pad(body), MEM_CLOSE]
        state.visible = body
        state.cursor = 0
        state.segment += 1
        state.summaries += 1
        return list(state.context)

    # -- tool ---------------------------------------------------------------------------------------
    def can_fork(self, state: BranchState) -> bool:
        """``FORK`` is a valid action now (the trajectory has forks left and is not done)."""
        return state.forks < self.config.policy_forks and not state.done

    def act(self, state: BranchState, output: list[int], rng: np.random.Generator) -> list[int]:
        """Grade the action ``output`` (its first token) and return the observation tokens.

        Appends action and observation to ``state.context``. A valid ``FORK`` is answered with
        verdict ``FORK`` (the caller forks the trajectory there).
        """
        c = self.config
        if not output:
            raise ValidationError("an action needs at least one token")
        token = int(output[0])
        state.turns += 1
        if token == FORK and self.can_fork(state):
            verdict = FORK
            state.forks += 1
        elif c.is_symbol(token) and not state.done:
            ok = token == state.task.key[state.slot]
            verdict = OK if ok else WRONG
            state.correct += int(ok)
            state.graded.append(ok)
            state.slot += 1
            state.cursor += 1
        else:
            verdict = INVALID
            state.invalid += 1
        ref = state.task.key[state.slot - 1] if state.slot > 0 else NONE
        noise = (c.noise_base + rng.integers(0, c.n_noise, c.noise_per_observation)).tolist()
        obs = [verdict, *noise, ref]
        state.context.extend([*(int(t) for t in output), *obs])
        return obs

    def timed_out(self, state: BranchState) -> bool:
        """The turn budget is spent and the key is not done."""
        return not state.done and state.turns >= self.config.max_turns

    def finished(self, state: BranchState) -> bool:
        return state.done or self.timed_out(state)

    def score(self, state: BranchState) -> float:
        """Checkable progress: slots emitted correctly / K (the reward, for success and timeout)."""
        return state.correct / state.task.length


# -- imperfect demonstrations ---------------------------------------------------------------------
@dataclass(frozen=True)
class DemoNoise:
    """How imperfect the demonstrator is (the pre-training data; RL has to fix the rest)."""

    wrong_action: float = 0.25
    """Probability that an action is a random symbol instead of the one the context points at."""
    invalid_action: float = 0.02
    """Probability that an action is a noise token (INVALID: wastes a turn)."""
    summary_substitute: float = 0.05
    """Per copied symbol: probability it is replaced by a random symbol."""
    summary_truncate: float = 0.3
    """Probability that a summary stops early, after a uniform number of the remaining symbols."""
    fork_action: float = 0.0
    """Probability that an action is ``FORK`` where the task allows one (``policy_forks``)."""


def teacher_action(env: KeyRecallEnv, state: BranchState, noise: DemoNoise, rng: np.random.Generator) -> int:
    """The demonstrator's action: the list element at the segment's cursor, with noise.

    It reads only what the context shows (``visible``); past the end of the list it guesses.
    """
    c = env.config
    if noise.fork_action > 0 and env.can_fork(state) and rng.random() < noise.fork_action:
        return FORK
    u = float(rng.random())
    if u < noise.invalid_action:
        return c.noise_base + int(rng.integers(0, c.n_noise))
    if u < noise.invalid_action + noise.wrong_action or state.cursor >= len(state.visible):
        return c.symbol(int(rng.integers(0, c.n_symbols)))
    return state.visible[state.cursor]


def teacher_summary(env: KeyRecallEnv, state: BranchState, noise: DemoNoise, rng: np.random.Generator) -> list[int]:
    """The demonstrator's summary: the not-yet-emitted part of the visible list, then ``SUM_END``."""
    c = env.config
    rest = list(state.visible[state.cursor :])
    if rest and rng.random() < noise.summary_truncate:
        rest = rest[: int(rng.integers(0, len(rest)))]
    out = [c.symbol(int(rng.integers(0, c.n_symbols))) if rng.random() < noise.summary_substitute else t for t in rest]
    return [*out[: c.max_summary_tokens - 1], SUM_END]


def render(tokens: list[int] | np.ndarray, config: KeyRecallConfig | None = None) -> str:
    """Human-readable tokens (symbols as ``s3``, noise as ``~7``)."""
    c = config or KeyRecallConfig()
    out = []
    for t in (int(x) for x in tokens):
        if t in TOKEN_NAMES:
            out.append(TOKEN_NAMES[t])
        elif c.is_symbol(t):
            out.append(f"s{t - SYMBOL_BASE}")
        elif c.noise_base <= t < c.vocab_size:
            out.append(f"~{t - c.noise_base}")
        else:
            out.append(f"?{t}")
    return " ".join(out)
