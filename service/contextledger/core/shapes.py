"""Provider message shapes: which one a message is in, and the pure conversions.

The ledger's canonical shape is OpenAI chat (Anthropic content blocks are kept as
given: the units and counters understand them). Gemini ``contents`` entries (role
``model``, ``parts``) are converted here; OpenAI Responses-API items are converted by
litellm (``contextledger.provider_shapes``). Pure: no I/O, no litellm.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Literal

from contextledger.errors import InvalidMessage

Shape = Literal["openai", "gemini", "responses"]
#: What ``get_messages_for_request(provider=...)`` renders for.
PROVIDERS = ("openai", "anthropic", "gemini")
_RESPONSES_TYPES = frozenset(
    {"message", "function_call", "function_call_output", "reasoning", "input_text", "output_text"}
)
_RESPONSES_BLOCKS = frozenset({"input_text", "output_text", "input_image", "input_file"})

HINT = (
    "accepted shapes: OpenAI chat {'role', 'content'} (Anthropic content blocks included), "
    "OpenAI Responses items ({'type': 'message' | 'function_call' | 'function_call_output'}) "
    "and Gemini contents ({'role': 'user' | 'model', 'parts': [...]})"
)


def shape_of(message: Mapping[str, Any]) -> Shape:
    """Cheap detection (runs on every append): the canonical shape unless a marker says not."""
    if "parts" in message or message.get("role") == "model":
        return "gemini"
    kind = message.get("type")
    if (kind is not None and "role" not in message) or kind == "message":
        return "responses"
    content = message.get("content")
    if (
        isinstance(content, list)
        and content
        and isinstance(content[0], Mapping)
        and content[0].get("type") in _RESPONSES_BLOCKS
    ):
        return "responses"
    return "openai"


def is_responses_item(message: Mapping[str, Any]) -> bool:
    kind = message.get("type")
    return kind in _RESPONSES_TYPES or (kind is None and "role" in message)


def from_gemini(message: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One Gemini ``contents`` entry as OpenAI chat messages (function responses become
    one ``tool`` message each; ids are derived from the call's name and position,
    since Gemini has none)."""
    role = message.get("role")
    parts = message.get("parts")
    if role not in ("user", "model", "function") or not isinstance(parts, list):
        raise InvalidMessage(
            f"a Gemini content needs role 'user' or 'model' and a list of parts, got role "
            f"{role!r}; {HINT}",
            field="parts",
        )
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    results: list[dict[str, Any]] = []
    for i, part in enumerate(parts):
        if not isinstance(part, Mapping):
            raise InvalidMessage(f"parts[{i}] must be a dict; {HINT}", field=f"parts[{i}]")
        call = part.get("functionCall", part.get("function_call"))
        response = part.get("functionResponse", part.get("function_response"))
        if "text" in part:
            texts.append(str(part["text"]))
        elif isinstance(call, Mapping):
            name = str(call.get("name", ""))
            calls.append(
                {
                    "id": str(call.get("id") or f"gemini-{name}-{i}"),
                    "type": "function",
                    "function": {"name": name, "arguments": json.dumps(call.get("args", {}))},
                }
            )
        elif isinstance(response, Mapping):
            name = str(response.get("name", ""))
            body = response.get("response", {})
            content = body.get("content") if isinstance(body, Mapping) else None
            results.append(
                {
                    "role": "tool",
                    "tool_call_id": str(response.get("id") or f"gemini-{name}-{i}"),
                    "name": name,
                    "content": content if isinstance(content, str) else json.dumps(body),
                }
            )
        else:
            raise InvalidMessage(
                f"parts[{i}]: only text, functionCall and functionResponse parts are "
                f"accepted (inline data: send it as an OpenAI image block); {HINT}",
                field=f"parts[{i}]",
            )
    if results:
        if texts or calls:
            raise InvalidMessage(
                f"a Gemini content mixing functionResponse with other parts; {HINT}",
                field="parts",
            )
        return results
    text = "\n".join(texts)
    if role == "model":
        out: dict[str, Any] = {"role": "assistant", "content": (text or None) if calls else text}
        if calls:
            out["tool_calls"] = calls
        return [out]
    return [{"role": "user", "content": text}]


def split_system(messages: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[str]]:
    """Messages without system/developer turns, and those turns' text (in order)."""
    rest: list[dict[str, Any]] = []
    system: list[str] = []
    for m in messages:
        if m.get("role") in ("system", "developer"):
            content = m.get("content")
            if isinstance(content, list):
                system.extend(str(b.get("text", "")) for b in content if isinstance(b, Mapping))
            else:
                system.append(str(content or ""))
        else:
            rest.append(m)
    return rest, system


_ANTHROPIC_ONLY = frozenset({"tool_use", "tool_result", "thinking", "redacted_thinking", "image"})


def has_anthropic_blocks(message: Mapping[str, Any]) -> bool:
    content = message.get("content")
    return isinstance(content, list) and any(
        isinstance(b, Mapping)
        and b.get("type") in _ANTHROPIC_ONLY
        and (b.get("type") != "image" or "source" in b)
        for b in content
    )


def _result_text(content: Any) -> str:
    if isinstance(content, list):
        return "\n".join(
            str(b.get("text", "")) for b in content if isinstance(b, Mapping) and "text" in b
        )
    return "" if content is None else str(content)


def anthropic_to_openai(message: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A stored Anthropic-shaped message (content blocks) as OpenAI chat messages:
    ``tool_use`` -> ``tool_calls``, each ``tool_result`` -> a ``tool`` message, base64
    or URL images -> ``image_url``, thinking -> ``thinking_blocks`` (what litellm's
    Anthropic converter reads back). Other messages come back unchanged."""
    if not has_anthropic_blocks(message):
        return [dict(message)]
    role = message.get("role")
    blocks: list[Any] = []
    calls: list[dict[str, Any]] = []
    results: list[dict[str, Any]] = []
    thinking: list[dict[str, Any]] = []
    for block in message.get("content") or []:
        kind = block.get("type") if isinstance(block, Mapping) else None
        if kind == "tool_use":
            calls.append(
                {
                    "id": str(block.get("id", "")),
                    "type": "function",
                    "function": {
                        "name": str(block.get("name", "")),
                        "arguments": json.dumps(block.get("input", {})),
                    },
                }
            )
        elif kind == "tool_result":
            results.append(
                {
                    "role": "tool",
                    "tool_call_id": str(block.get("tool_use_id", "")),
                    "content": _result_text(block.get("content")),
                }
            )
        elif kind in ("thinking", "redacted_thinking"):
            thinking.append(dict(block))
        elif kind == "image" and isinstance(block.get("source"), Mapping):
            source = block["source"]
            url = (
                f"data:{source.get('media_type', 'image/png')};base64,{source.get('data', '')}"
                if source.get("type") == "base64"
                else str(source.get("url", ""))
            )
            blocks.append({"type": "image_url", "image_url": {"url": url}})
        else:
            blocks.append(block)
    out: list[dict[str, Any]] = list(results)
    if role == "assistant":
        msg: dict[str, Any] = {"role": "assistant", "content": blocks or None}
        if calls:
            msg["tool_calls"] = calls
        if thinking:
            msg["thinking_blocks"] = thinking
        out.append(msg)
    elif blocks or not results:
        out.append({**{k: v for k, v in message.items() if k != "content"}, "content": blocks})
    return out


def to_openai(
    messages: list[dict[str, Any]], *, keep_thinking: bool = False
) -> list[dict[str, Any]]:
    """The view with Anthropic content blocks turned into OpenAI chat (pure)."""
    out: list[dict[str, Any]] = []
    for m in messages:
        for converted in anthropic_to_openai(m):
            if not keep_thinking:
                converted.pop("thinking_blocks", None)
            out.append(converted)
    return out
