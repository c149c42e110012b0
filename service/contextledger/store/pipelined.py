"""Statements behind a transaction-mode pooler in one round trip each.

PgBouncer in transaction mode may lend another server connection after every ``Sync``,
so asyncpg's named prepared statements are off there (``statement_cache_size=0``).
asyncpg then spends two round trips on each statement: ``Parse``/``Describe`` to learn
the parameter and result types, then ``Parse``/``Bind``/``Execute``/``Sync`` (it parses
again, because the first ``Sync`` may have ended on another server connection). The
types of a statement's text do not change while the schema does not, so
``PoolerConnection`` keeps what ``Describe`` said per statement text (never a name on
the server) and every later run is the second round trip alone.

``prefix`` builds the ``Parse``/``Bind``/``Execute`` of a statement without parameters
that a connection sends in front of another one's, before the same ``Sync``: both run
in one implicit transaction on one server connection, whichever the pooler lends
(it hands a server connection back only at a ``ReadyForQuery`` outside a
transaction). ``store/scoped.py`` uses it to set the tenant for a lone statement.
"""

from __future__ import annotations

import struct
from collections import OrderedDict
from typing import Any

import asyncpg

#: Statement texts whose types a connection keeps (the store's are a few dozen).
DESCRIBED_MAX = 256


def _message(kind: bytes, body: bytes) -> bytes:
    return kind + struct.pack("!i", len(body) + 4) + body


def prefix(query: str) -> bytes:
    """``Parse``/``Bind``/``Execute`` of ``query`` (no parameters, no rows: its rows
    would be read as the next statement's), in the unnamed statement and portal, with
    no ``Sync``: it runs in the transaction of the statement sent after it."""
    text = query.encode() + b"\x00"
    return (
        _message(b"P", b"\x00" + text + struct.pack("!h", 0))
        + _message(b"B", b"\x00\x00" + struct.pack("!hhh", 0, 0, 0))
        + _message(b"E", b"\x00" + struct.pack("!i", 0))
    )


class PoolerConnection(asyncpg.Connection):  # type: ignore[misc]
    """An asyncpg connection for a transaction-mode pooler: unnamed statements whose
    ``Describe`` is kept per statement text, so each run is one round trip. With
    asyncpg's own statement cache on (a direct connection) it is a plain connection."""

    _described: OrderedDict[tuple[Any, ...], Any] | None = None

    async def _get_statement(
        self,
        query: str,
        timeout: Any,  # noqa: ASYNC109
        *,
        named: Any = False,
        use_cache: bool = True,
        ignore_custom_codec: bool = False,
        record_class: Any = None,
    ) -> Any:
        if named is not False or not use_cache or self._stmt_cache_enabled:
            return await super()._get_statement(
                query,
                timeout,
                named=named,
                use_cache=use_cache,
                ignore_custom_codec=ignore_custom_codec,
                record_class=record_class,
            )
        described = self._described
        if described is None:
            described = self._described = OrderedDict()
        key = (query, record_class, ignore_custom_codec)
        state = described.get(key)
        if state is not None:
            described.move_to_end(key)
            return state
        # unnamed and marked unprepared by asyncpg (its cache is off): each run parses
        # it again in its own Parse/Bind/Execute/Sync
        state = await super()._get_statement(
            query,
            timeout,
            named=False,
            use_cache=True,
            ignore_custom_codec=ignore_custom_codec,
            record_class=record_class,
        )
        if not state.name and not state.prepared:
            described[key] = state
            if len(described) > DESCRIBED_MAX:
                described.popitem(last=False)
        return state

    def _drop_local_statement_cache(self) -> None:
        """asyncpg drops its cache when a statement's types went stale (a schema change,
        ``reload_schema_state``): the kept descriptions go with it."""
        super()._drop_local_statement_cache()
        if self._described is not None:
            self._described.clear()
