"""A small async event bus for context events, and the pre-compact decision hook.

Observers must never be able to break the memory they observe: a failing
listener is logged (``hook_failed``) and the caller carries on. Events can be
forwarded to an Amplifier coordinator's ``hooks`` (anything with
``async emit(event, data)``), with the same containment.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol, cast

import structlog

log = structlog.get_logger(__name__)

MESSAGE_ADDED = "context:message_added:debug"
INCLUDE = "context:include"
PRE_COMPACT = "context:pre_compact"
POST_COMPACT = "context:post_compact"
OVERFLOW = "context:overflow"
SUMMARIZATION = "context:summarization"
#: Every event name a session emits, for listeners that want them all by name.
HOOK_EVENTS: tuple[str, ...] = (
    MESSAGE_ADDED,
    INCLUDE,
    PRE_COMPACT,
    POST_COMPACT,
    OVERFLOW,
    SUMMARIZATION,
)
#: Subscribe to every event.
WILDCARD = "*"

Handler = Callable[[str, dict[str, Any]], Awaitable[object] | object]
"""``handler(event_name, data)``; sync or async; its return value is ignored."""


class HookEmitter(Protocol):
    """What ``forward_to`` needs: Amplifier's ``coordinator.hooks`` fits."""

    async def emit(self, event: str, data: dict[str, Any]) -> Any: ...


class HookBus:
    """Publish/subscribe by event name; ``"*"`` handlers see every event."""

    def __init__(self, *, forward_to: HookEmitter | None = None) -> None:
        self._handlers: dict[str, list[Handler]] = {}
        self.forward_to = forward_to

    def on(self, event_name: str, handler: Handler) -> Callable[[], None]:
        """Subscribe; returns a callable that unsubscribes (safe to call twice)."""
        self._handlers.setdefault(event_name, []).append(handler)

        def unsubscribe() -> None:
            handlers = self._handlers.get(event_name, [])
            if handler in handlers:
                handlers.remove(handler)

        return unsubscribe

    def has_listeners(self, event_name: str) -> bool:
        """Lets callers skip building expensive payloads (e.g. debug events) nobody reads."""
        return bool(
            self._handlers.get(event_name) or self._handlers.get(WILDCARD) or self.forward_to
        )

    async def emit(self, event_name: str, data: Mapping[str, Any]) -> None:
        """Call the event's handlers, then the wildcard ones, then ``forward_to``, in order.

        Each handler gets its own shallow copy of ``data`` so one cannot change
        what the next sees at the top level. Nothing raised by a handler escapes.
        """
        targets = [*self._handlers.get(event_name, ()), *self._handlers.get(WILDCARD, ())]
        for handler in targets:
            try:
                result = handler(event_name, dict(data))
                if inspect.isawaitable(result):
                    await result
            except Exception as exc:
                _failed(event_name, _name(handler), _raised(exc))
        if self.forward_to is not None:
            try:
                await self.forward_to.emit(event_name, dict(data))
            except Exception as exc:
                _failed(event_name, "forward_to", _raised(exc))


def _name(handler: object) -> str:
    return str(getattr(handler, "__qualname__", None) or type(handler).__name__)


def _raised(exc: Exception) -> str:
    return f"{type(exc).__name__}: {exc}"


def _failed(event_name: str, handler: str, error: str) -> None:
    """The one log line (``hook_failed``) for a hook that raised or answered wrongly."""
    log.warning("hook_failed", hook_event=event_name, handler=handler, error=error)


# ---------------------------------------------------------------- pre-compact decision


@dataclass(frozen=True, slots=True)
class CompactContext:
    """What a pre-compact hook is told about the compaction about to happen."""

    trigger: Literal["manual", "auto"]
    current_tokens: int
    target_tokens: int
    message_count: int
    custom_instructions: str | None = None


@dataclass(frozen=True, slots=True)
class CompactDecision:
    """A hook's answer: cancel, steer the summarizer, or supply the summary itself."""

    cancel: bool = False
    custom_instructions: str | None = None
    custom_summary: str | None = None


PreCompactHandler = Callable[
    [CompactContext], CompactDecision | Awaitable[CompactDecision | None] | None
]
"""Returns a decision (or ``None`` for the default); sync or async."""


async def decide(handler: PreCompactHandler | None, ctx: CompactContext) -> CompactDecision:
    """Ask the pre-compact hook; no hook, ``None``, a failure or a wrong type → the default.

    The default keeps ``ctx.custom_instructions`` so a manual compact's
    instructions survive a hook that fails.
    """
    default = CompactDecision(custom_instructions=ctx.custom_instructions)
    if handler is None:
        return default
    try:
        result = cast(object, handler(ctx))  # checked at runtime below: hooks are user code
        if inspect.isawaitable(result):
            result = await result
    except Exception as exc:
        _failed(PRE_COMPACT, _name(handler), _raised(exc))
        return default
    if result is None:
        return default
    if not isinstance(result, CompactDecision):
        _failed(
            PRE_COMPACT, _name(handler), f"returned {type(result).__name__}, not CompactDecision"
        )
        return default
    return result
