"""Process groups for the Megatron-core backend: idempotent set-up and tear-down (gloo on the CPU).

``init_parallel`` makes sure ``torch.distributed`` and megatron-core's ``parallel_state`` are
initialized. In a process where nobody did it yet (tests, ``sapwood learn``) it starts a one-rank
gloo group on a free local port; under ``torch.multiprocessing`` / ``torchrun`` the caller starts
the world and ``init_parallel`` only adds megatron's tensor/data-parallel groups. Calling it again
with the same layout is a no-op; ``teardown_parallel`` undoes only what ``init_parallel`` did.

Megatron is imported inside the functions so that ``sapwood.learner`` imports without it.
"""

from __future__ import annotations

import socket
import threading
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from sapwood.learner.errors import ConfigError

__all__ = ["ParallelLayout", "free_port", "init_parallel", "layout", "megatron_parallel_state", "teardown_parallel"]

_LOCK = threading.RLock()
_OWNS_PROCESS_GROUP = False


@dataclass(frozen=True)
class ParallelLayout:
    """Where this process sits: world size, tensor-parallel and data-parallel ranks."""

    world_size: int
    tensor_parallel: int
    tp_rank: int
    data_parallel: int
    dp_rank: int


def megatron_parallel_state() -> Any:
    """``megatron.core.parallel_state``, with a clear error when the ``megatron`` extra is missing."""
    import warnings

    try:
        with warnings.catch_warnings():  # "Transformer Engine and Apex are not installed" on every CPU import
            warnings.simplefilter("ignore", UserWarning)
            from megatron.core import parallel_state
    except ImportError as exc:
        raise ConfigError("the megatron backend needs megatron-core: pip install 'sapwood[megatron]'") from exc
    return parallel_state


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (for a process group's rendezvous)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def layout() -> ParallelLayout:
    """The current layout (``init_parallel`` must have run)."""
    ps = megatron_parallel_state()
    if not ps.model_parallel_is_initialized():
        raise ConfigError("megatron parallel state is not initialized; call init_parallel() first")
    return ParallelLayout(
        world_size=dist.get_world_size(),
        tensor_parallel=ps.get_tensor_model_parallel_world_size(),
        tp_rank=ps.get_tensor_model_parallel_rank(),
        data_parallel=ps.get_data_parallel_world_size(),
        dp_rank=ps.get_data_parallel_rank(),
    )


def init_parallel(tensor_parallel: int = 1, *, backend: str = "gloo") -> ParallelLayout:
    """Initialize ``torch.distributed`` (one local rank if not yet) and megatron's model parallel groups.

    Args:
        tensor_parallel: tensor-parallel size; must divide the world size (the rest is data parallel).
        backend: process group backend when this call starts the group (``"gloo"`` on the CPU).

    Raises:
        ConfigError: the groups exist already with another tensor-parallel size, or it does not
            divide the world size.
    """
    if tensor_parallel < 1:
        raise ConfigError(f"tensor_parallel must be >= 1, got {tensor_parallel}")
    global _OWNS_PROCESS_GROUP
    with _LOCK:
        ps = megatron_parallel_state()
        if not dist.is_initialized():
            dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
            _OWNS_PROCESS_GROUP = True
        if ps.model_parallel_is_initialized():
            have = ps.get_tensor_model_parallel_world_size()
            if have != tensor_parallel:
                raise ConfigError(f"megatron parallel state already has tensor_parallel={have}, "
                                  f"asked for {tensor_parallel}; call teardown_parallel() first")
        else:
            world = dist.get_world_size()
            if world % tensor_parallel:
                raise ConfigError(f"tensor_parallel={tensor_parallel} does not divide the world size {world}")
            ps.initialize_model_parallel(tensor_model_parallel_size=tensor_parallel)
        return layout()


def teardown_parallel() -> None:
    """Destroy megatron's groups, and the process group if ``init_parallel`` created it. Safe to repeat."""
    global _OWNS_PROCESS_GROUP
    with _LOCK:
        ps = megatron_parallel_state()
        if ps.model_parallel_is_initialized():
            ps.destroy_model_parallel()
        if _OWNS_PROCESS_GROUP and dist.is_initialized():
            dist.destroy_process_group()
        _OWNS_PROCESS_GROUP = False


def all_reduce_sum(tensor: torch.Tensor, group: Any) -> torch.Tensor:
    """In-place sum over ``group`` (a no-op for a one-rank group); returns ``tensor``."""
    if dist.get_world_size(group) > 1:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=group)
    return tensor
