"""Exceptions raised by ``sapwood.learner``.

* ``LearnerError`` — base class.
* ``BatchValidationError`` — a ``TreeBatch`` breaks a structural invariant
  (also a ``ValueError``).
* ``ConfigError`` — a configuration value is out of range (also a ``ValueError``).
"""

from __future__ import annotations

__all__ = ["BatchValidationError", "ConfigError", "LearnerError"]


class LearnerError(Exception):
    """Base class of the learner's exceptions."""


class BatchValidationError(LearnerError, ValueError):
    """A ``TreeBatch`` is malformed; the message names the field, the token and what was expected."""


class ConfigError(LearnerError, ValueError):
    """A learner configuration value is invalid; the message says what was expected."""
