"""The working view's element: one message as projection, compaction and the store see it.

A ``ViewItem`` is identified by ``ref = (seq, part)``: the ledger event that
introduced it and, for events that carry several messages (``messages.replaced``),
the index within that event. ``ord`` orders items; a summary takes the ``ord``
of the first item it replaces, so it sits where the summarized turns sat.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

Ref = tuple[int, int]
ItemKind = Literal["message", "summary", "ephemeral", "synthetic"]

#: ``ord`` of the message appended at ``seq`` is ``seq * ORD_STRIDE (+ part)``;
#: ephemeral messages slot in between persisted ones (see session.py).
ORD_STRIDE = 1_000_000


@dataclass(frozen=True, slots=True)
class ViewItem:
    """One message of a view. ``message`` must be treated as read-only."""

    ref: Ref
    ord: int
    message: Mapping[str, Any]
    tokens: int
    critical: bool = False
    kind: ItemKind = "message"
    meta: Mapping[str, Any] = field(default_factory=dict)

    @property
    def seq(self) -> int:
        """The seq of the event the item comes from."""
        return self.ref[0]

    @property
    def position(self) -> int:
        """The seq this item stands at in the view: its own, or for a summary the first
        seq it covers. Summary ranges are ranges of positions, so a rolling summary can
        cover the previous summary without also swallowing the turns after it."""
        return self.ord // ORD_STRIDE

    @property
    def place(self) -> tuple[int, int]:
        """``(position, part)``: unique in a view, ordered like the view."""
        return divmod(self.ord, ORD_STRIDE)

    @property
    def role(self) -> str:
        """The message's role (``""`` when it has none)."""
        return str(self.message.get("role", ""))
