"""Canonical JSON: the bytes that are hashed, and the compact JSON sent on the wire.

Canonical means sorted keys, no spaces and numbers as PostgreSQL's jsonb gives them
back, so a hash computed before storing still matches the stored data.
"""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any


def _canonical_numbers(value: Any) -> Any:
    """Make floats encode the way PostgreSQL's jsonb will give them back.

    jsonb stores numbers as exact decimals and prints integral ones without an
    exponent (1e16 comes back as 10000000000000000), so an integral float is
    encoded as the integer its decimal text denotes. Non-integral floats already
    round-trip through their shortest repr.
    """
    if isinstance(value, float):
        if value.is_integer():
            return int(Decimal(repr(value)))
        return value
    if isinstance(value, dict):
        return {k: _canonical_numbers(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_canonical_numbers(v) for v in value]
    return value


def has_float(value: Any) -> bool:
    """Whether any float (or float subclass) sits in ``value``; exact-type checks first."""
    kind = type(value)
    if kind is float or isinstance(value, float):
        return True
    if kind is dict or kind is list or kind is tuple:
        for item in value.values() if kind is dict else value:
            t = type(item)
            if (
                t is float
                or (t is not str and isinstance(item, float))
                or ((t is dict or t is list or t is tuple) and has_float(item))
            ):
                return True
    return False


# Built once: json.dumps with non-default options builds a new encoder on every call.
_CANONICAL = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
)
_COMPACT = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def canonical_json(value: Any, *, floats: bool | None = None) -> bytes:
    """Deterministic UTF-8 JSON: sorted keys, no spaces, jsonb-stable numbers.

    ``floats``: whether ``value`` holds any, if the caller already knows.
    """
    if has_float(value) if floats is None else floats:  # most messages have none
        value = _canonical_numbers(value)
    return _CANONICAL.encode(value).encode("utf-8")


def dumps(value: Any) -> str:
    """Compact JSON for the wire (not canonical: key order is the caller's)."""
    return _COMPACT.encode(value)
