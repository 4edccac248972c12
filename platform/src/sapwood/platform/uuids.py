"""UUID text checked at C speed: the canonical lowercase form passes a regex, anything else goes through
:class:`uuid.UUID` (which accepts the other spellings and rejects what is not a UUID)."""

from __future__ import annotations

import re
import uuid
from collections.abc import Sequence

_HEX = "[0-9a-f]"
_ONE = f"{_HEX}{{8}}-{_HEX}{{4}}-{_HEX}{{4}}-{_HEX}{{4}}-{_HEX}{{12}}"
#: ``8-4-4-4-12`` lowercase hex, the form :func:`str` of a :class:`uuid.UUID` gives.
CANONICAL_UUID = re.compile(_ONE)
_ARRAY = re.compile(rf"\{{{_ONE}(?:,{_ONE})*\}}")


def canonical_uuid(text: str) -> str:
    """``text`` as canonical UUID text; :class:`ValueError` (or :class:`TypeError`) when it is not a UUID."""
    if isinstance(text, str) and CANONICAL_UUID.fullmatch(text):
        return text
    return str(uuid.UUID(text))


def uuid_array_literal(values: Sequence[str]) -> str:
    """A PostgreSQL ``uuid[]`` array literal of ``values`` (one regex over the whole literal when all
    are canonical already); :class:`ValueError` when one is not a UUID."""
    literal = "{" + ",".join(values) + "}"
    # The length check keeps one value holding two UUIDs ("<uuid>,<uuid>") from passing as two.
    if len(literal) == 37 * len(values) + 1 and _ARRAY.fullmatch(literal):
        return literal
    return "{" + ",".join(canonical_uuid(v) for v in values) + "}"


__all__ = ["CANONICAL_UUID", "canonical_uuid", "uuid_array_literal"]
