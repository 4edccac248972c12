"""Backend registry: build a ``PolicyBackend`` by name (``sapwood learn --backend``, the demo, benchmarks).

``"torch"``: ``TorchBackend`` on ``TinyActorCritic``. ``"megatron"``: ``MegatronBackend`` on
megatron-core ``GPTModel`` trunks (the ``megatron`` extra; imported only when asked for). Both
start from the same weights for the same torch seed: without ``init_state`` a ``TinyActorCritic``
is initialized and, for megatron, mapped into its layout.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from sapwood.learner.config import LearnerConfig
from sapwood.learner.errors import ConfigError
from sapwood.learner.model import PolicyBackend, TinyActorCritic, TinyTransformerConfig, TorchBackend

__all__ = ["BACKENDS", "check_backend", "create_backend"]

BACKENDS = ("torch", "megatron")
"""Names ``create_backend`` accepts."""


def check_backend(name: str) -> str:
    """``name`` if it is a known backend, else a ``ConfigError`` listing the known ones."""
    if name not in BACKENDS:
        raise ConfigError(f"unknown learner backend {name!r}; expected one of {', '.join(BACKENDS)}")
    return name


def create_backend(
    name: str,
    model_config: TinyTransformerConfig,
    config: LearnerConfig,
    *,
    init_state: dict[str, Tensor] | None = None,
    policy_version: int = 0,
    **options: Any,
) -> PolicyBackend:
    """A backend with ``config``'s optimizers and clipping.

    Args:
        name: ``"torch"`` or ``"megatron"``.
        model_config: model shape.
        config: learner configuration (optimizers, critic clip, loss aggregation).
        init_state: initial weights as a ``TinyActorCritic`` state dict; None: a fresh ``TinyActorCritic``
            from torch's current random state.
        policy_version: version of the initial weights.
        options: backend-specific keywords (megatron: ``tensor_parallel``, ``dtype``).
    """
    check_backend(name)
    model = TinyActorCritic(model_config)
    if init_state is not None:
        model.load_state_dict(init_state)
    if name == "torch":
        if options:
            raise ConfigError(f"the torch backend takes no options, got {sorted(options)}")
        return TorchBackend.from_config(model, config, policy_version=policy_version)
    from sapwood.learner.megatron_backend import MegatronBackend

    return MegatronBackend.from_config(model_config, config, init_state=model.state_dict(),
                                       policy_version=policy_version, **options)
