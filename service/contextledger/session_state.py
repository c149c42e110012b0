"""The state of one ``Session`` handle, in one owner its collaborators share.

``Session`` is a façade over ``WritePath``, ``RequestPath``, ``Compactor`` and
``SessionBudget``; each used to read and write the session's private fields through a
Protocol. They now receive this object: the chain tip this handle knows (``head`` and the
``known`` (seq, hash) pin appends are checked against), the view's tokens, the stored
info, the config in force and the ephemeral items. The tip moves through ``advance``
only (``adopt`` resets it from a re-read), so "head and its hash move together" is a
rule in one place, not a convention in six.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from contextledger.core.config import ContextConfig
from contextledger.core.view import ViewItem
from contextledger.protocols import LedgerHandle
from contextledger.store.base import SessionInfo, Store

__all__ = ["SessionState"]


@dataclass(eq=False, slots=True)
class SessionState:
    """What one session handle knows; owned by its ``Session``, shared by reference."""

    session_id: str
    store: Store
    ledger: LedgerHandle
    info: SessionInfo
    config: ContextConfig
    #: the last seq this process wrote or read
    head: int
    #: a (seq, hash) this handle saw on the chain: every append is pinned to it, so a
    #: stale handle never writes onto a re-created session
    known: tuple[int, str]
    view_tokens: int
    #: items shown in this process's views only, never written
    ephemeral: list[ViewItem] = field(default_factory=list)

    @classmethod
    def of(cls, ledger: LedgerHandle, info: SessionInfo, config: ContextConfig) -> SessionState:
        """The state of a handle just opened on ``info``."""
        return cls(
            info.session_id,
            ledger.store,
            ledger,
            info,
            config,
            info.head,
            (info.head, info.last_hash),
            info.view_tokens,
        )

    def advance(
        self, seq: int, last_hash: str | None = None, *, view_tokens: int | None = None
    ) -> None:
        """The chain reached ``seq`` (with hash ``last_hash``, when known): an append's
        result, an event read back, a view tail's head. The head never moves back (an
        older (seq, hash) found later is still on the chain, so it is a valid pin), and
        the pin moves whenever a hash comes with the seq."""
        self.head = max(self.head, seq)
        if last_hash is not None:
            self.known = (seq, last_hash)
        if view_tokens is not None:
            self.view_tokens = view_tokens

    def adopt(self, info: SessionInfo) -> None:
        """Take the stored state as it is now (``Session.refresh``): head, pin and tokens
        are the store's, even behind what this handle saw (a purge and re-create)."""
        self.info = info
        self.head, self.view_tokens = info.head, info.view_tokens
        self.known = (info.head, info.last_hash)
