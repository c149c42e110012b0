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

A run is also one TCP segment (``OneSegment``): asyncpg writes an unprepared
statement's ``Parse`` and its ``Bind``/``Execute``/``Sync`` separately, and the scope
came before them, so a lone statement went out in three segments, each a send, a
wake-up of the pooler and of the server on a 2-core machine where they all queue for
the same cores.
"""

from __future__ import annotations

import contextlib
import socket
import struct
from collections import OrderedDict
from collections.abc import Callable, Coroutine, Generator
from typing import Any

import asyncpg

#: Statement texts whose types a connection keeps (the store's are a few dozen).
DESCRIBED_MAX = 256
#: Holds a socket's small writes back until it is released (Linux); None elsewhere.
TCP_CORK: int | None = getattr(socket, "TCP_CORK", None)


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
    ``Describe`` is kept per statement text, so each run is one round trip, sent as one
    TCP segment. With asyncpg's own statement cache on (a direct connection) it is a
    plain connection."""

    _described: OrderedDict[tuple[Any, ...], Any] | None = None
    #: the socket ``OneSegment`` corks (None: not TCP, or no TCP_CORK); False: not looked up
    _corked: Any = False

    def _lead(self) -> bytes | None:
        """Messages to send in front of the next statement, before its ``Sync`` (none
        here: ``store/scoped.py`` sends a tenant's scope)."""
        return None

    def _cork_socket(self) -> Any:
        sock = self._corked
        if sock is False:
            sock = self._transport.get_extra_info("socket")
            if (
                TCP_CORK is None
                or sock is None
                or sock.family
                not in (
                    socket.AF_INET,
                    socket.AF_INET6,
                )
            ):
                sock = None
            self._corked = sock
        return sock

    async def _do_execute(
        self,
        query: Any,
        executor: Any,
        timeout: Any,  # noqa: ASYNC109
        retry: bool = True,
        **kw: Any,
    ) -> Any:
        """Each run of an unprepared statement (asyncpg's retry included) goes out in one
        segment, after what ``_lead`` gives."""
        if self._stmt_cache_enabled or isinstance(executor, OneSegment):
            return await super()._do_execute(query, executor, timeout, retry, **kw)
        one = OneSegment(self, executor, self._lead())
        return await super()._do_execute(query, one, timeout, retry, **kw)

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


class OneSegment:
    """asyncpg's executor of a statement, whose messages leave in one TCP segment:
    ``lead`` first (if any), then asyncpg's ``Parse`` and ``Bind``/``Execute``/``Sync``.

    asyncpg writes them in the first step of its coroutine, before it waits for the
    answer; the socket is corked for that step only (``TCP_CORK``: the kernel sends
    what was written when it is released). A step that writes nothing (asyncpg waits
    for a cancellation first) sends ``lead`` alone, then the statement as asyncpg does:
    in order, as ever."""

    __slots__ = ("_conn", "_executor", "_lead")

    def __init__(self, conn: PoolerConnection, executor: Any, lead: bytes | None) -> None:
        self._conn, self._executor, self._lead = conn, executor, lead

    async def __call__(self, stmt: Any, timeout: Any) -> Any:  # noqa: ASYNC109
        conn, lead = self._conn, self._lead
        sock = None if conn.is_closed() else conn._cork_socket()
        sent = conn._protocol.queries_count  # asyncpg counts a statement once it is sent
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, TCP_CORK, 1)
        try:
            if lead is not None:
                conn._transport.write(lead)
            return await _FirstStep(self._executor(stmt, timeout), lambda: _uncork(sock))
        except BaseException:
            if lead is not None and conn._protocol.queries_count == sent:
                # failed before the statement and its Sync went out (arguments that do
                # not encode, a cancellation): the lead would head whatever comes next
                # on this connection. It is closed, never reused.
                conn.terminate()
            raise


def _uncork(sock: Any) -> None:
    if sock is not None:
        # OSError: closed under it (a protocol error aborted the transport)
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, TCP_CORK, 0)


class _FirstStep:
    """Awaits ``coro`` as ``await`` would, calling ``after`` once its first step (up to
    its first wait) has run, however it ended."""

    __slots__ = ("_after", "_coro")

    def __init__(self, coro: Coroutine[Any, Any, Any], after: Callable[[], None]) -> None:
        self._coro, self._after = coro, after

    def __await__(self) -> Generator[Any, Any, Any]:
        coro = self._coro
        try:
            signal = coro.send(None)
        except StopIteration as stop:
            return stop.value
        finally:
            self._after()
        while True:  # what ``yield from coro`` does, from its second step on
            try:
                value = yield signal
            except GeneratorExit:
                coro.close()
                raise
            except BaseException as exc:
                try:
                    signal = coro.throw(exc)
                except StopIteration as stop:
                    return stop.value
            else:
                try:
                    signal = coro.send(value)
                except StopIteration as stop:
                    return stop.value
