"""JSON numbers that every store reads back as written: the rule at the boundary and the reader.

The rule: a JSON number is accepted when it is an IEEE-754 double exactly, i.e. a finite float, or
an integer that equals its double (every integer within ±2**53, and larger ones such as ``10**20``
that a double holds exactly). NaN, ±Infinity and integers a double would round are refused.

The reader (:func:`load_json`, both engines' JSON deserializer): PostgreSQL's JSONB keeps numbers as
``numeric`` and prints a float such as ``1e20`` as ``100000000000000000000`` (and ``3.735998389999474e16``
as ``37359983899994740``, which is not that double's exact value); read with plain :func:`json.loads`
that is an integer, beyond 64 bits one that no JSON writer of the API (orjson) accepts. Under the rule
above every integer beyond ±2**53 came from a double, so the reader returns it as the nearest double:
every accepted value reads back equal on SQLite and PostgreSQL.
"""

from __future__ import annotations

import json
import math
import sys
from typing import Any

from sapwood.platform.errors import ValidationError

#: Integers every double holds, hence every JSON reader (JavaScript's ±Number.MAX_SAFE_INTEGER + 1).
EXACT_INT_MAX = 2**53
#: The largest finite double: the bound of every JSON number (the OpenAPI schema's minimum/maximum).
DOUBLE_MAX = sys.float_info.max
#: Nesting depth checked by :func:`check_json_numbers` (deeper values are refused as such).
JSON_MAX_DEPTH = 64


def number_problem(value: int | float) -> str | None:
    """Why ``value`` is not an IEEE-754 double exactly (None when it is)."""
    if isinstance(value, float):
        return None if math.isfinite(value) else f"{value} is not a finite number (NaN and Infinity are refused)"
    if -EXACT_INT_MAX <= value <= EXACT_INT_MAX:
        return None
    try:
        exact = float(value) == value
    except OverflowError:
        exact = False
    if exact:
        return None
    return (f"integer {value:.3e} is not exactly an IEEE-754 double (integers within ±2**53, or ones a double "
            "holds exactly, are accepted)")


def check_json_numbers(value: Any, where: str, *, max_depth: int = JSON_MAX_DEPTH) -> None:
    """Raise :class:`ValidationError` naming the path (``where.key[3]``) of the first number that breaks the rule.

    Iterative (no recursion limit); containers nested deeper than ``max_depth`` are refused.
    """
    stack: list[tuple[Any, str, int]] = [(value, where, 0)]
    while stack:
        item, path, depth = stack.pop()
        if isinstance(item, bool) or item is None or isinstance(item, str):
            continue
        if isinstance(item, int | float):
            problem = number_problem(item)
            if problem is not None:
                raise ValidationError(f"{path}: {problem}")
        elif isinstance(item, dict | list | tuple):
            if depth >= max_depth:
                raise ValidationError(f"{path}: nested deeper than {max_depth} levels")
            pairs = item.items() if isinstance(item, dict) else enumerate(item)
            for key, child in pairs:
                label = f"{path}.{key}" if isinstance(item, dict) else f"{path}[{key}]"
                stack.append((child, label, depth + 1))


def doubles_for_large_ints(value: Any) -> Any:
    """``value`` with every integer beyond ±2**53 as its double (what :func:`load_json` reads back).

    Returns ``value`` itself when nothing changes. For values :func:`check_json_numbers` accepted
    (their depth is bounded, so the recursion is).
    """
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return value if -EXACT_INT_MAX <= value <= EXACT_INT_MAX else float(value)
    if isinstance(value, dict):
        items = {k: doubles_for_large_ints(v) for k, v in value.items()}
        return value if all(items[k] is value[k] for k in value) else items
    if isinstance(value, list | tuple):
        converted = [doubles_for_large_ints(v) for v in value]
        return value if all(a is b for a, b in zip(converted, value, strict=True)) else type(value)(converted)
    return value


def _parse_int(text: str) -> int | float:
    number = int(text)
    return number if -EXACT_INT_MAX <= number <= EXACT_INT_MAX else float(number)


def dump_json(value: Any) -> str:
    """:func:`json.dumps` without the blanks after ``,`` and ``:`` (a stored JSON column is read, never shown:
    the blanks were 2 bytes per key of every stored event's body)."""
    return json.dumps(value, separators=(",", ":"))


def load_json(text: str | bytes) -> Any:
    """:func:`json.loads`, with integers beyond ±2**53 read as the doubles they were written as."""
    return json.loads(text, parse_int=_parse_int)
