"""The message model: validation, defensive copies and the canonical encoding.

Messages are stored as given (OpenAI or Anthropic shape) and come back equal, so
validation only rejects what could not round-trip through PostgreSQL's jsonb or
what no provider accepts. ``validate_message`` returns a deep copy: the caller's
dict is never mutated and never aliased by the ledger.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

from contextledger.core.encoding import dumps
from contextledger.errors import InvalidMessage

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
        raise InvalidMessage(
            f"{path}: contains a NUL character, which jsonb cannot store", field=path
        )
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
            raise InvalidMessage(
                "'tool_calls' must be a list on an assistant message", field="tool_calls"
            )
        for i, call in enumerate(tool_calls):
            if not isinstance(call, Mapping) or not isinstance(call.get("id"), str):
                raise InvalidMessage(
                    f"tool_calls[{i}] needs a string 'id'", field=f"tool_calls[{i}]"
                )
            function = call.get("function")
            if function is not None and not (
                isinstance(function, Mapping) and isinstance(function.get("name"), str)
            ):
                raise InvalidMessage(
                    f"tool_calls[{i}].function needs a string 'name'",
                    field=f"tool_calls[{i}].function",
                )
            arguments = function.get("arguments") if function is not None else None
            if arguments is not None and not isinstance(arguments, str):
                raise InvalidMessage(  # (its text need not parse: models emit broken JSON)
                    f"tool_calls[{i}].function.arguments must be a string (the JSON text "
                    "OpenAI sends), not an object",
                    field=f"tool_calls[{i}].function.arguments",
                )
    copied: dict[str, Any] = _copy_json(message, "message", 0)
    size = len(dumps(copied).encode("utf-8"))
    if size > MAX_MESSAGE_BYTES:
        raise InvalidMessage(
            f"message is {size} bytes of JSON; the limit is {MAX_MESSAGE_BYTES}",
            field="message",
            size=size,
        )
    return copied


def text_of(message: Mapping[str, Any]) -> str:
    """All the text of a message: content strings, text blocks, tool inputs and outputs."""
    parts: list[str] = []

    def walk(value: Any) -> None:
        if isinstance(value, str):
            parts.append(value)
        elif isinstance(value, Mapping):
            for key in ("text", "content", "input", "arguments", "function", "name"):
                if key in value:
                    inner = value[key]
                    if key == "input" and not isinstance(inner, str):
                        inner = json.dumps(inner, default=str)
                    walk(inner)
        elif isinstance(value, Sequence):
            for element in value:
                walk(element)

    walk(message.get("content"))
    walk(message.get("tool_calls"))
    return "\n".join(parts)


def own_text(message: Mapping[str, Any]) -> str:
    """The text its author wrote: string content and text blocks, not tool traffic."""
    if str(message.get("role", "")) in ("tool", "function"):
        return ""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            str(b.get("text", ""))
            for b in content
            if isinstance(b, Mapping) and b.get("type") in ("text", "input_text", "output_text")
        )
    return ""
