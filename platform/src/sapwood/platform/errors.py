"""Sapwood's exception tree, documented in one place.

    SapwoodError
    ├── ValidationError          bad input: the event or request is wrong, retrying will not help
    │   ├── SchemaVersionError   unknown schema or wire version
    │   ├── DTypeError           a token/log-prob array has the wrong dtype
    │   ├── TokenRangeError      negative or out-of-vocabulary token ids
    │   ├── LengthMismatchError  output ids and log-probs of different length
    │   ├── UnknownParentError   a referenced node / fork point / execution does not exist
    │   ├── DigestMismatchError  the reconstructed input does not hash to the recorded digest
    │   ├── SequenceError        per-execution order violated (gap, reuse, event after finish)
    │   └── DecodeError          bytes that are not a Sapwood event
    │       └── PayloadTooLargeError   a record or its decompressed payload exceeds the event limit
    ├── ConflictError            an id was reused with different content
    └── StoreError               the database failed (driver errors are translated to this)
        └── StoreUnavailableError  the connection was lost; the operation may be retried
"""

from __future__ import annotations


class SapwoodError(Exception):
    """Base class of every error Sapwood raises on purpose."""


class ValidationError(SapwoodError):
    """The input is invalid; it says what was wrong and what was expected."""

    #: Short machine-readable reason, stored with dead letters.
    reason: str = "invalid"

    def __init__(self, message: str, *, event_id: str | None = None) -> None:
        super().__init__(message)
        self.event_id = event_id


class SchemaVersionError(ValidationError):
    reason = "schema_version"


class DTypeError(ValidationError):
    reason = "dtype"


class TokenRangeError(ValidationError):
    reason = "token_range"


class LengthMismatchError(ValidationError):
    reason = "length_mismatch"


class UnknownParentError(ValidationError):
    reason = "unknown_reference"


class DigestMismatchError(ValidationError):
    reason = "digest_mismatch"


class SequenceError(ValidationError):
    reason = "sequence"


class DecodeError(ValidationError):
    reason = "decode"


class PayloadTooLargeError(DecodeError):
    """The record, or what its payload decompresses to, is larger than the event limit."""

    reason = "too_large"


class ConflictError(SapwoodError):
    """An event id (or sequence number) was reused for different content."""

    reason = "conflict"


class StoreError(SapwoodError):
    """The database failed; the original driver error is chained as ``__cause__``."""


class StoreUnavailableError(StoreError):
    """The database connection was lost or refused; the operation may be retried."""
