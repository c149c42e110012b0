"""Structural protocols contextledger implements, checkable at runtime.

``ContextManager`` mirrors Amplifier's ``amplifier_core.interfaces.ContextManager``
(which is not ``@runtime_checkable``) so callers can ask
``isinstance(obj, ContextManager)`` without depending on amplifier-core.

The writers return ``object`` rather than Amplifier's ``None``: a ``Session``
returns the seq it wrote, and callers of the protocol must not rely on the
return value either way. Parameter types are Amplifier's; ``Session`` accepts
wider ones (any ``Mapping``/``Sequence``).
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

__all__ = ["ContextManager"]


@runtime_checkable
class ContextManager(Protocol):
    """Amplifier's context-manager contract: what an orchestrator calls."""

    async def add_message(self, message: dict[str, Any]) -> object:
        """Add a message to the context."""
        ...

    async def get_messages_for_request(
        self, token_budget: int | None = None, provider: Any | None = None
    ) -> list[dict[str, Any]]:
        """Messages for the next LLM request, compacted (ephemerally) to fit."""
        ...

    async def get_messages(self) -> list[dict[str, Any]]:
        """The full history, uncompacted."""
        ...

    async def set_messages(self, messages: list[dict[str, Any]]) -> object:
        """Replace all messages (session restore)."""
        ...

    async def clear(self) -> object:
        """Remove all messages."""
        ...
