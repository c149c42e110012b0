"""What a settings or model change records: ``config.changed`` and ``model.changed``.

A new model (or a new counter for the same model) recounts the current view once and
records the counts in the event, so later reads and replays never re-tokenize.
"""

from __future__ import annotations

from typing import Protocol

from contextledger._checks import checked_tokens
from contextledger.core.config import ContextConfig
from contextledger.core.events import ConfigChanged, ModelChanged, Payload
from contextledger.core.tokens import TokenCounter
from contextledger.store.base import Store

__all__ = ["ChangingSession", "settings_change"]


class ChangingSession(Protocol):
    """What a settings change needs of its ``Session`` (a port: no import cycle)."""

    session_id: str
    counter: TokenCounter

    @property
    def model(self) -> str | None: ...


async def settings_change(
    session: ChangingSession,
    store: Store,
    config: ContextConfig | None,
    model: str | None,
    counter: TokenCounter,
) -> list[Payload]:
    """The batch that records ``config`` and/or ``model`` (``None``: unchanged), counted
    by ``counter`` (the new settings' counter); empty when nothing changes."""
    payloads: list[Payload] = []
    if config is not None:
        payloads.append(ConfigChanged(config.to_dict()))
    if model is not None or counter.name != session.counter.name:  # recount once
        items = await store.read_view(session.session_id)
        recount = tuple((i.ref, checked_tokens(counter.count_message(i.message))) for i in items)
        payloads.append(ModelChanged(model or session.model, counter.name, recount))
    return payloads
