"""UUID text checked at C speed: the canonical lowercase form passes a regex, anything else goes through
:class:`uuid.UUID` (which accepts the other spellings and rejects what is not a UUID)."""

from __future__ import annotations

import re
import uuid

_HEX = "[0-9a-f]"
#: One canonical UUID (a regex fragment).
UUID_PATTERN = f"{_HEX}{{8}}-{_HEX}{{4}}-{_HEX}{{4}}-{_HEX}{{4}}-{_HEX}{{12}}"
#: ``8-4-4-4-12`` lowercase hex, the form :func:`str` of a :class:`uuid.UUID` gives.
CANONICAL_UUID = re.compile(UUID_PATTERN)


def canonical_uuid(text: str) -> str:
    """``text`` as canonical UUID text; :class:`ValueError` (or :class:`TypeError`) when it is not a UUID."""
    if isinstance(text, str) and CANONICAL_UUID.fullmatch(text):
        return text
    return str(uuid.UUID(text))


__all__ = ["CANONICAL_UUID", "canonical_uuid"]
