"""How a framework adapter gets its ledger: the one it was given, or one it opens.

Every adapter takes exactly one of ``ledger=`` (an open ``Ledger``: its owner closes it)
or ``dsn=`` (the adapter opens a ledger on first use and closes it in ``close()``). The
four adapters used to write that four times with three behaviours (one took no lock, so
a concurrent first use could open two pools and leak one); ``OwnedLedger`` is the one way.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from contextledger.errors import InvalidArgument
from contextledger.ledger import Ledger

__all__ = ["OwnedLedger"]


def _invalid(message: str) -> Exception:
    return InvalidArgument(message, field="ledger")


class OwnedLedger:
    """The ledger ``ledger=`` gave (never closed here) or the one opened from ``dsn=`` on
    the first ``get()`` — once, even when first uses race — and closed by ``close()``
    (a later ``get()`` opens a new one).

    ``error`` builds the exception for a wrong ``ledger=``/``dsn=`` pair, so an adapter
    raises its framework's own type (``UserError``…); by default ``InvalidArgument``.
    A ledger opened here lives on the event loop of the first ``get()`` (its pool does):
    an adapter serving several loops keeps one ``OwnedLedger`` per loop.
    """

    def __init__(
        self,
        ledger: Ledger | None = None,
        dsn: str | None = None,
        *,
        error: Callable[[str], Exception] = _invalid,
    ) -> None:
        if (ledger is None) == (dsn is None):
            raise error("pass exactly one of ledger= or dsn=")
        self.given = ledger
        self.dsn = dsn
        self._opened: Ledger | None = None
        self._lock = asyncio.Lock()  # binds to the loop it is first contended on

    @property
    def owned(self) -> bool:
        """Whether the ledger is opened (and closed) here: ``dsn=`` was given."""
        return self.given is None

    @property
    def target(self) -> str | None:
        """The DSN the ledger is on (``dsn=``, or the given ledger's; None when unknown)."""
        return self.dsn if self.given is None else self.given.dsn

    async def get(self) -> Ledger:
        """The ledger: the given one, or the one opened here (opened now if need be)."""
        if self.given is not None:
            return self.given
        if self._opened is None:
            async with self._lock:
                if self._opened is None:
                    self._opened = await Ledger.open(self.dsn)
        return self._opened

    async def close(self) -> None:
        """Close the ledger if it was opened here; a given one stays open."""
        opened, self._opened = self._opened, None
        if opened is not None:
            await opened.close()
