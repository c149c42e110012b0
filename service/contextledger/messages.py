"""The message model: validation, defensive copies and the canonical encoding.

Messages are stored as given (OpenAI or Anthropic shape) and come back equal, so
validation only rejects what could not round-trip through PostgreSQL's jsonb or
what no provider accepts. ``validate_message`` returns a deep copy: the caller's
dict is never mutated and never aliased by the ledger.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

from .errors import InvalidMessage

ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})
#: A single message above this many bytes of JSON is rejected (jsonb allows 255 MB,
#: but a message that large is a bug upstream, not context).
MAX_MESSAGE_BYTES = 8 * 1024 * 1024
MAX_DEPTH = 64

JSONValue = Any


def _copy_json(value: Any, path: str, depth: int) -> JSONValue:
    """Deep-copy ``value`` while checking it is plain JSON that jsonb can hold exactly."""
    if depth > MAX_DEPTH:
        raise InvalidMessage(f"{path}: nested deeper than {MAX_DEPTH} levels", field=path)
    if type(value) is str:  # the common leaf first
        _check_text(value, path)
        return value
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        if value.bit_length() > 4000:  # ~1,200 digits: past any real use, near int->str limits
            raise InvalidMessage(f"{path}: integer too large to store", field=path)
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidMessage(f"{path}: {value!r} is not valid JSON", field=path)
        return float(value)  # a subclass (numpy.float64) would escape has_float
    if isinstance(value, str):
        _check_text(value, path)
        return value
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise InvalidMessage(
                    f"{path}: key {key!r} is not a string (JSON keys must be)", field=path
                )
            _check_text(key, f"{path}.{key}")
            out[key] = _copy_json(item, f"{path}.{key}", depth + 1)
        return out
    if isinstance(value, list):
        return [_copy_json(item, f"{path}[{i}]", depth + 1) for i, item in enumerate(value)]
    raise InvalidMessage(
        f"{path}: a {type(value).__name__} is not JSON-able (use str, int, float, bool, "
        "None, list or dict)",
        field=path,
    )


def _check_text(text: str, path: str) -> None:
    if "\x00" in text:
        raise InvalidMessage(f"{path}: contains a NUL character, which jsonb cannot store",
                             field=path)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidMessage(f"{path}: not valid Unicode ({exc.reason})", field=path) from None


def copy_json(value: Any, path: str = "value") -> JSONValue:
    """Validated deep copy of an arbitrary JSON value (config, metadata)."""
    return _copy_json(value, path, 0)


def validate_message(message: Any) -> dict[str, Any]:
    """Check ``message`` and return a deep copy safe to store; raise ``InvalidMessage``."""
    if not isinstance(message, Mapping):
        raise InvalidMessage(
            f"a message must be a dict, not {type(message).__name__}", field="message"
        )
    role = message.get("role")
    if not isinstance(role, str) or role not in ROLES:
        raise InvalidMessage(
            f"unknown role {role!r}; expected one of {sorted(ROLES)}", field="role"
        )
    has_tool_calls = bool(message.get("tool_calls")) or bool(message.get("function_call"))
    if "content" not in message and not (role == "assistant" and has_tool_calls):
        raise InvalidMessage(f"{role} message has no 'content'", field="content")
    content = message.get("content")
    if content is None:
        if not (role == "assistant" and has_tool_calls):
            raise InvalidMessage(f"{role} message has content None", field="content")
    elif isinstance(content, list):
        for i, block in enumerate(content):
            if not isinstance(block, Mapping) or not isinstance(block.get("type"), str):
                raise InvalidMessage(
                    f"content[{i}] must be a dict with a string 'type'", field=f"content[{i}]"
                )
    elif not isinstance(content, str):
        raise InvalidMessage(
            f"content must be a string, a list of blocks or None, not {type(content).__name__}",
            field="content",
        )
    if role == "tool":
        tcid = message.get("tool_call_id")
        if not isinstance(tcid, str) or not tcid:
            raise InvalidMessage("tool message without a 'tool_call_id'", field="tool_call_id")
    tool_calls = message.get("tool_calls")
    if tool_calls is not None:
        if role != "assistant" or not isinstance(tool_calls, list):
            raise InvalidMessage("'tool_calls' must be a list on an assistant message",
                                 field="tool_calls")
        for i, call in enumerate(tool_calls):
            if not isinstance(call, Mapping) or not isinstance(call.get("id"), str):
                raise InvalidMessage(f"tool_calls[{i}] needs a string 'id'",
                                     field=f"tool_calls[{i}]")
            function = call.get("function")
            if function is not None and not (
                    isinstance(function, Mapping) and isinstance(function.get("name"), str)):
                raise InvalidMessage(f"tool_calls[{i}].function needs a string 'name'",
                                     field=f"tool_calls[{i}].function")
    copied: dict[str, Any] = _copy_json(message, "message", 0)
    size = len(dumps(copied).encode("utf-8"))
    if size > MAX_MESSAGE_BYTES:
        raise InvalidMessage(
            f"message is {size} bytes of JSON; the limit is {MAX_MESSAGE_BYTES}",
            field="message", size=size,
        )
    return copied


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
        for item in (value.values() if kind is dict else value):
            t = type(item)
            if t is float or (t is not str and isinstance(item, float)) or (
                    (t is dict or t is list or t is tuple) and has_float(item)):
                return True
    return False


# Built once: json.dumps with non-default options builds a new encoder on every call.
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                              allow_nan=False)
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
