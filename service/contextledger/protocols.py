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

import asyncio
from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

from contextledger.core.config import ContextConfig
from contextledger.core.tokens import TokenCounter
from contextledger.hooks import PreCompactHandler
from contextledger.store.base import Checkpoint, Store

__all__ = ["ContextManager", "LedgerHandle"]


class LedgerHandle(Protocol):
    """What a ``Session`` (and its compactor) need from the ``Ledger`` that opened it.

    A port rather than the class, so ``session.py`` does not import ``ledger.py``
    (which imports it to build sessions): the import graph stays acyclic.
    """

    store: Store
    hook_target: Any | None
    pre_compact: PreCompactHandler | None

    def check_open(self) -> None: ...
    def keep(self, task: asyncio.Task[Any], *, resumable: bool = False) -> None: ...
    def secret(self, model: str, api_base: str | None) -> str | None: ...
    def config_from(self, stored: Mapping[str, Any]) -> ContextConfig: ...
    def remember_secrets(self, config: ContextConfig) -> None: ...
    def counter_for(self, model: str | None, config: ContextConfig) -> TokenCounter: ...
    async def warm_counter(self, model: str | None, config: ContextConfig) -> TokenCounter: ...
    async def warm_model(self, model: str, config: ContextConfig) -> None: ...
    async def fork(
        self,
        source_id: str,
        new_id: str,
        *,
        at: Checkpoint | str | int | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> Any: ...  # a Session (named here, the import graph would have a cycle)


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
