"""Provider shapes in and out, with litellm's own converters (imported off the loop).

In: ``normalize`` turns an OpenAI Responses item (litellm's
``transform_responses_api_input_to_messages``) or a Gemini content
(``core.shapes.from_gemini``) into OpenAI chat messages; the session records the
original beside each one for audit. Out: ``render`` turns the OpenAI-shaped
request view into Anthropic (``anthropic_messages_pt``: tool results as
``tool_result`` blocks, system separate) or Gemini (``_gemini_convert_messages_with_history``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from contextledger._litellm import import_litellm
from contextledger.core.shapes import (
    HINT,
    PROVIDERS,
    from_gemini,
    is_responses_item,
    shape_of,
    split_system,
    to_openai,
)
from contextledger.errors import InvalidArgument, InvalidMessage


@dataclass(frozen=True)
class ProviderRequest:
    """A request view in a provider's shape. ``system`` is the system prompt the
    provider takes separately (Anthropic ``system=``, Gemini ``system_instruction``)."""

    provider: str
    messages: list[dict[str, Any]]
    system: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def _litellm_attr(module: str, name: str) -> Any:
    import importlib

    import_litellm()  # offline-configured first
    return getattr(importlib.import_module(module), name)


def _from_responses(message: Mapping[str, Any]) -> list[dict[str, Any]]:
    if not is_responses_item(message):
        raise InvalidMessage(f"unknown Responses item type {message.get('type')!r}; {HINT}")
    config: Any = _litellm_attr(
        "litellm.responses.litellm_completion_transformation.transformation",
        "LiteLLMCompletionResponsesConfig",
    )
    converted: list[Any] = config.transform_responses_api_input_to_messages([dict(message)], {})
    out: list[dict[str, Any]] = []
    for m in converted:
        d: dict[str, Any] = dict(m) if isinstance(m, Mapping) else m.model_dump(exclude_none=True)
        for call in d.get("tool_calls") or []:
            call.pop("index", None)
        out.append(d)
    if not out:
        raise InvalidMessage(f"this Responses item carries no message; {HINT}")
    return out


async def normalize(message: Mapping[str, Any]) -> list[dict[str, Any]]:
    """``message`` as OpenAI chat messages (one, or several for Gemini function results)."""
    shape = shape_of(message)
    if shape == "gemini":
        return from_gemini(message)
    if shape == "responses":
        return await asyncio.to_thread(_from_responses, message)
    return [dict(message)]


def _render_sync(messages: list[dict[str, Any]], provider: str, model: str) -> ProviderRequest:
    rest, system = split_system(to_openai(messages, keep_thinking=provider == "anthropic"))
    system_text = "\n\n".join(s for s in system if s) or None
    if provider == "anthropic":
        convert = _litellm_attr(
            "litellm.litellm_core_utils.prompt_templates.factory", "anthropic_messages_pt"
        )
        converted: list[Any] = convert(rest, model=model, llm_provider="anthropic")
    else:
        convert = _litellm_attr(
            "litellm.llms.vertex_ai.gemini.transformation", "_gemini_convert_messages_with_history"
        )
        converted = convert(rest, model=model)
    return ProviderRequest(provider, [dict(m) for m in converted], system_text)


async def render(
    messages: list[dict[str, Any]], provider: str, model: str | None = None
) -> ProviderRequest:
    """The OpenAI-shaped view in ``provider``'s shape (converted off the event loop)."""
    if provider not in PROVIDERS:
        raise InvalidArgument(
            f"provider must be one of {PROVIDERS} or a provider object, got {provider!r}",
            field="provider",
        )
    if provider == "openai":
        return ProviderRequest("openai", to_openai(messages))
    default = "claude-sonnet-4-20250514" if provider == "anthropic" else "gemini-2.0-flash"
    try:
        return await asyncio.to_thread(_render_sync, messages, provider, model or default)
    except Exception as exc:  # litellm's converters refuse what the provider would refuse
        # (no message but system ones for Anthropic, arguments that are not a JSON
        # object...): the caller's view cannot take that shape, said as such
        raise InvalidArgument(
            f"the request cannot be put in {provider}'s shape: {type(exc).__name__}: "
            f"{str(exc)[:300]}",
            field="provider",
            code="UNRENDERABLE",
        ) from None


def as_message_list(request: ProviderRequest) -> list[dict[str, Any]]:
    """``get_messages_for_request``'s list form: the system prompt, when there is one,
    leads as ``{"role": "system", "content": ...}`` (pass it as ``system=``)."""
    if request.system is None:
        return request.messages
    return [{"role": "system", "content": request.system}, *request.messages]
