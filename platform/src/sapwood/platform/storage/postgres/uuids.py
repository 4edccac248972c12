"""PostgreSQL ``IN`` over UUIDs: one ``uuid[]`` literal instead of a bind per value."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from sapwood.platform.uuids import UUID_PATTERN, canonical_uuid

_ARRAY = re.compile(rf"\{{{UUID_PATTERN}(?:,{UUID_PATTERN})*\}}")


def uuid_in(column: sa.ColumnElement[Any], param: str) -> sa.ColumnElement[bool]:
    """``column IN :param`` for a UUID column on PostgreSQL, ``param`` bound to one ``uuid[]`` literal
    (:func:`uuid_array_literal`).

    Faster than a bind per value or a driver-adapted list (both cost Python work per element), and the
    statement it belongs to can be built once and reused.
    """
    # IN (SELECT unnest(...)): a semi-join the planner can hash or drive through the index;
    # `= ANY(array)` would compare every scanned row with the whole array.
    array = sa.cast(sa.bindparam(param, type_=sa.Text), postgresql.ARRAY(sa.Uuid))
    return column.in_(sa.select(sa.func.unnest(array)))


def uuid_array_literal(values: Sequence[str]) -> str:
    """A PostgreSQL ``uuid[]`` array literal of ``values`` (one regex over the whole literal when all
    are canonical already); :class:`ValueError` when one is not a UUID."""
    literal = "{" + ",".join(values) + "}"
    # The length check keeps one value holding two UUIDs ("<uuid>,<uuid>") from passing as two.
    if len(literal) == 37 * len(values) + 1 and _ARRAY.fullmatch(literal):
        return literal
    return "{" + ",".join(canonical_uuid(v) for v in values) + "}"
