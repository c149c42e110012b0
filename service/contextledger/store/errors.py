"""One translation from driver, pool and server failures to contextledger's typed errors.

Every public entry point of the PostgreSQL store (and the migrations, and
``Ledger.open``) passes what escapes it through ``translate``, so a caller sees
``LedgerUnavailable`` (retryable: the server is away), ``LedgerRefused`` (the
server said no: retrying unchanged will not help) or ``LedgerCredentialsRejected``
(the login itself was refused: a configuration mistake, never "unreachable"), each
with a stable ``code`` and a sentence saying what to check — never an ``OSError``
or an asyncpg class.
"""

from __future__ import annotations

import functools
import socket
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any, ParamSpec, TypeVar

import asyncpg

from contextledger.errors import (
    ContextLedgerError,
    LedgerClosed,
    LedgerCredentialsRejected,
    LedgerRefused,
    LedgerUnavailable,
)

P = ParamSpec("P")
T = TypeVar("T")

_RETRY = "Retry later; appends carrying an idempotency key are safe to retry."
#: A connection that failed (by SQLSTATE, by driver exception or by OS error): one verdict.
_CONNECTION_FAILED: tuple[type[ContextLedgerError], str, str] = (
    LedgerUnavailable,
    "CONNECTION_LOST",
    "the connection failed. " + _RETRY,
)

#: SQLSTATE → (family, code, what to do). Classes are matched by SQLSTATE so a
#: SQLAlchemy-wrapped error (which carries ``.sqlstate`` too) maps the same way.
_SQLSTATES: dict[str, tuple[type[ContextLedgerError], str, str]] = {
    "57P03": (
        LedgerUnavailable,
        "SERVER_STARTING",
        "the database server is starting up or shutting down. " + _RETRY,
    ),
    "57P01": (
        LedgerUnavailable,
        "SERVER_STOPPING",
        "the database server is shutting down (admin shutdown). " + _RETRY,
    ),
    "57P02": (LedgerUnavailable, "SERVER_STOPPING", "the database server crashed. " + _RETRY),
    "53300": (
        LedgerUnavailable,
        "TOO_MANY_CONNECTIONS",
        "the server has no free connection slots. Retry later, lower pool_size, "
        "or raise max_connections.",
    ),
    "08000": _CONNECTION_FAILED,
    "08003": (LedgerUnavailable, "CONNECTION_LOST", "the connection is gone. " + _RETRY),
    "08006": _CONNECTION_FAILED,
    "08001": (
        LedgerUnavailable,
        "CONNECTION_REFUSED",
        "could not establish a connection. " + _RETRY,
    ),
    "08004": (
        LedgerUnavailable,
        "CONNECTION_REFUSED",
        "the server rejected the connection. " + _RETRY,
    ),
    "3D000": (
        LedgerRefused,
        "DATABASE_MISSING",
        "the server has no database of the name the DSN gives. Check the database name in "
        "the DSN, or create it (contextledger migrate then creates the tables).",
    ),
    "25006": (
        LedgerRefused,
        "READ_ONLY",
        "the database is read-only (a standby, or default_transaction_read_only). "
        "Point the ledger at the primary.",
    ),
    "42501": (
        LedgerRefused,
        "PERMISSION_DENIED",
        "the database role lacks a privilege the ledger needs. Grant it "
        "(see the migrations for the tables) or connect as the owner.",
    ),
    "53100": (
        LedgerRefused,
        "DISK_FULL",
        "the database server's disk is full. Free space, then retry.",
    ),
    "57014": (
        LedgerRefused,
        "STATEMENT_TIMEOUT",
        "the statement was cancelled (statement_timeout or a cancel request). "
        "Raise statement_timeout for this role or retry.",
    ),
}


#: Invalid authorization (class 28): a wrong password (28P01), an unknown user or no
#: ``pg_hba.conf`` entry for this host/user/database (28000).
_CREDENTIALS = (
    "the server rejected the login. Check the user and password in the DSN (or the "
    "PGPASSWORD / .pgpass it relies on) and that pg_hba.conf admits this user from this "
    "host; retrying unchanged will not help."
)


def _found(
    family: type[ContextLedgerError], code: str, advice: str, exc: BaseException
) -> ContextLedgerError:
    return family(f"{advice} ({type(exc).__name__}: {exc})", code=code, cause=type(exc).__name__)


def translate(exc: BaseException) -> ContextLedgerError | None:
    """The typed error for a driver/pool/server failure, or ``None`` to let ``exc`` pass.

    Our own errors, cancellation and programming errors pass through untouched.
    """
    if isinstance(exc, ContextLedgerError) or not isinstance(exc, Exception):
        return None
    orig = getattr(exc, "orig", None)  # sqlalchemy.exc.DBAPIError
    if isinstance(orig, BaseException) and orig is not exc:
        inner = translate(orig)
        if inner is not None:
            return inner
    sqlstate = getattr(exc, "sqlstate", None)
    if isinstance(exc, asyncpg.PostgresError) or (isinstance(sqlstate, str) and len(sqlstate) == 5):
        entry = _SQLSTATES.get(str(sqlstate))
        if entry is not None:
            return _found(*entry, exc)
        if str(sqlstate).startswith("28"):
            return _found(LedgerCredentialsRejected, "CREDENTIALS_REJECTED", _CREDENTIALS, exc)
        if isinstance(exc, asyncpg.PostgresConnectionError) or str(sqlstate).startswith("08"):
            return _found(*_CONNECTION_FAILED, exc)
        if isinstance(exc, asyncpg.PostgresError):
            return _found(
                LedgerRefused,
                "DATABASE_ERROR",
                f"the database refused the operation (SQLSTATE {sqlstate}). Check the server "
                "log; retrying unchanged will not help.",
                exc,
            )
    if isinstance(exc, asyncpg.InterfaceError):
        text = str(exc)
        if "pool is clos" in text:  # only its ledger closes it: waiting will not help
            return _found(
                LedgerClosed,
                "POOL_CLOSED",
                "the ledger was closed (its connection pool is). Open a new Ledger.",
                exc,
            )
        if isinstance(exc, asyncpg.ClientConfigurationError | ValueError):
            return None  # a bug or bad argument on our side: not an outage
        return _found(*_CONNECTION_FAILED, exc)
    if isinstance(exc, asyncpg.InternalClientError):
        return _found(
            LedgerUnavailable, "CONNECTION_LOST", "the connection broke mid-call. " + _RETRY, exc
        )
    if isinstance(exc, socket.gaierror):
        return _found(
            LedgerUnavailable,
            "HOST_NOT_FOUND",
            "the host name in the DSN does not resolve. Check the host for a typo; if it is "
            "right, the name service (DNS) is failing: retry later.",
            exc,
        )
    if isinstance(exc, FileNotFoundError | ConnectionRefusedError):
        return _found(
            LedgerUnavailable,
            "CONNECTION_REFUSED",
            "nothing accepts connections at that host and port: the server is not running "
            "(or restarting), or the port (or socket directory) in the DSN is wrong. " + _RETRY,
            exc,
        )
    if isinstance(exc, TimeoutError):
        return _found(
            LedgerUnavailable,
            "TIMED_OUT",
            "the server did not answer in time (when connecting: a firewall dropping "
            "packets, or a wrong host or port; later: an overloaded server or a lost "
            "network). " + _RETRY,
            exc,
        )
    if isinstance(exc, OSError):  # resets, broken pipes, connect timeouts
        return _found(*_CONNECTION_FAILED, exc)
    return None


def translated(
    fn: Callable[P, Coroutine[Any, Any, T]],
) -> Callable[P, Coroutine[Any, Any, T]]:
    """Decorate a store coroutine so what escapes it is typed (see ``translate``)."""

    @functools.wraps(fn)
    async def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
        try:
            return await fn(*args, **kwargs)
        except Exception as exc:
            typed = translate(exc)
            if typed is None:
                raise
            raise typed from exc

    return wrapper


def translated_iter(fn: Callable[P, AsyncIterator[T]]) -> Callable[P, AsyncIterator[T]]:
    """``translated`` for an async generator."""

    @functools.wraps(fn)
    async def wrapper(*args: P.args, **kwargs: P.kwargs) -> AsyncIterator[T]:
        try:
            async for item in fn(*args, **kwargs):
                yield item
        except Exception as exc:
            typed = translate(exc)
            if typed is None:
                raise
            raise typed from exc

    return wrapper
