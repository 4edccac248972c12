"""Training checkpoints: everything a learner needs to continue, written atomically, named by digest.

A checkpoint file holds (``torch.save`` of a dict, :data:`FORMAT`):

* ``backend`` — ``PolicyBackend.state_dict()``: weights, both optimizers (their step counts are the
  LR schedule's position: the optimizers run at a constant learning rate), the policy version, and
  for megatron its shard layout;
* ``trainer`` — the SAO trainer's counters: ``steps``, ``critic_warmup_done``, ``value_loss_ema``
  (the critic warm-up and catch-up state);
* ``rng`` — the random states of torch (CPU and every CUDA device), numpy and Python's ``random``;
* ``policy_version`` — the version the file publishes (also readable by rollout engines, which
  look for ``backend.model``).

:func:`write_checkpoint` serializes to memory, hashes the bytes (SHA-256), writes them to a hidden
temporary name in the same directory, fsyncs, and renames to ``policy-v{version:06d}-{digest[:16]}.pt``:
a reader never sees a partial file, and the name says which bytes it must hold. :func:`read_checkpoint`
refuses a file whose digest differs. :func:`remove_unpublished` deletes checkpoints no run published
(a learner killed between its rename and its commit leaves one) once they are older than a grace period.
"""

from __future__ import annotations

import hashlib
import io
import os
import random
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from sapwood.learner.errors import LearnerError
from sapwood.learner.model import PolicyBackend
from sapwood.learner.trainer import SAOTrainer
from sapwood.platform.fsync import fsync_dir

__all__ = ["FORMAT", "CheckpointError", "WrittenCheckpoint", "read_checkpoint", "remove_unpublished",
           "restore_training_state", "training_state", "write_checkpoint"]

FORMAT = "sapwood.training-checkpoint/1"
#: Names :func:`write_checkpoint` gives (and the only files :func:`remove_unpublished` may delete).
_NAME = re.compile(r"^policy-v\d{6,}-[0-9a-f]{16}\.pt$")
_TMP = re.compile(r"^\.policy-v\d{6,}\.[0-9a-f]+\.tmp$")


class CheckpointError(LearnerError):
    """A checkpoint is missing, unreadable, or its bytes do not match the published digest."""


@dataclass(frozen=True)
class WrittenCheckpoint:
    """A checkpoint renamed into place: its path and the SHA-256 hex digest of its bytes."""

    path: Path
    digest: str


def training_state(trainer: SAOTrainer) -> dict[str, Any]:
    """The checkpoint dict of ``trainer`` and its backend (see the module docstring)."""
    backend: PolicyBackend = trainer.backend
    return {
        "format": FORMAT,
        "policy_version": backend.policy_version,
        "backend": backend.state_dict(),
        "trainer": {"steps": trainer.steps, "critic_warmup_done": trainer.critic_warmup_done,
                    "value_loss_ema": trainer.value_loss_ema},
        "rng": {
            "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
            "numpy": np.random.get_state(),
            "python": random.getstate(),
        },
    }


def restore_training_state(trainer: SAOTrainer, state: dict[str, Any]) -> None:
    """Load a :func:`training_state` dict into ``trainer`` (weights, optimizers, counters, RNG states)."""
    if state.get("format") != FORMAT:
        raise CheckpointError(f"checkpoint format {state.get('format')!r}, expected {FORMAT!r}")
    trainer.backend.load_state_dict(state["backend"])
    counters = state["trainer"]
    trainer.steps = int(counters["steps"])
    trainer.critic_warmup_done = int(counters["critic_warmup_done"])
    ema = counters["value_loss_ema"]
    trainer.value_loss_ema = None if ema is None else float(ema)
    rng = state["rng"]
    torch.set_rng_state(rng["torch"])
    if rng["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])
    np.random.set_state(rng["numpy"])
    random.setstate(rng["python"])


def checkpoint_name(version: int, digest: str) -> str:
    """File name of version ``version`` whose bytes hash to ``digest``."""
    return f"policy-v{version:06d}-{digest[:16]}.pt"


def write_checkpoint(directory: str | Path, version: int, state: dict[str, Any]) -> WrittenCheckpoint:
    """Write ``state`` as version ``version`` under ``directory``: temporary name, fsync, rename."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    torch.save(state, buf)
    data = buf.getvalue()
    digest = hashlib.sha256(data).hexdigest()
    path = directory / checkpoint_name(version, digest)
    tmp = directory / f".policy-v{version:06d}.{os.getpid():x}{time.monotonic_ns():x}.tmp"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(path)
    fsync_dir(directory)
    return WrittenCheckpoint(path, digest)


def read_checkpoint(path: str | Path, digest: str) -> dict[str, Any]:
    """The checkpoint dict at ``path``; :class:`CheckpointError` if it is missing or its digest differs."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise CheckpointError(f"published checkpoint {path} cannot be read: {exc}") from exc
    found = hashlib.sha256(data).hexdigest()
    if found != digest:
        raise CheckpointError(f"checkpoint {path} has SHA-256 {found}, but {digest} was published")
    state = torch.load(io.BytesIO(data), map_location="cpu", weights_only=False)
    if not isinstance(state, dict):
        raise CheckpointError(f"checkpoint {path} holds a {type(state).__name__}, expected a dict")
    return state


def remove_unpublished(directory: str | Path, published: Iterable[str], *, grace_s: float,
                       now: float | None = None) -> list[Path]:
    """Delete the checkpoints (and temporary files) in ``directory`` not in ``published`` and older than
    ``grace_s`` seconds (by modification time); return what was removed. Other files are left alone."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    keep = {Path(p).resolve() for p in published}
    now = time.time() if now is None else now
    removed = []
    for entry in directory.iterdir():
        if not (_NAME.match(entry.name) or _TMP.match(entry.name)) or entry.resolve() in keep:
            continue
        try:
            if now - entry.stat().st_mtime > grace_s:
                entry.unlink()
                removed.append(entry)
        except FileNotFoundError:  # another learner cleaned it first
            continue
    return sorted(removed)
