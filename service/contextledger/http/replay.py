"""An ASGI ``receive`` that gives back what a middleware already read of the body first
(the lane and the guard both read a body before the app does)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]


def replay(consumed: list[Message], receive: Receive) -> Receive:
    """``receive`` that first gives back ``consumed``, then reads on."""
    pending = list(consumed)

    async def replayed() -> Message:
        if pending:
            return pending.pop(0)
        return await receive()

    return replayed
