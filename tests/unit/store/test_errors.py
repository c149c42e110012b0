"""The store boundary's translation table: real driver/server exceptions → typed errors."""

from __future__ import annotations

import asyncio
import socket

import asyncpg
import pytest
from sqlalchemy.exc import DBAPIError, OperationalError

from contextledger import Ledger
from contextledger.errors import (
    ConcurrencyError,
    ContextLedgerError,
    InvalidArgument,
    LedgerClosed,
    LedgerCredentialsRejected,
    LedgerRefused,
    LedgerUnavailable,
    SessionNotFound,
)
from contextledger.store.errors import translate, translated

CASES: list[tuple[BaseException, type[ContextLedgerError], str]] = [
    (FileNotFoundError(2, "No such file or directory"), LedgerUnavailable, "CONNECTION_REFUSED"),
    (ConnectionRefusedError(111, "Connection refused"), LedgerUnavailable, "CONNECTION_REFUSED"),
    (ConnectionResetError(104, "reset by peer"), LedgerUnavailable, "CONNECTION_LOST"),
    (TimeoutError(), LedgerUnavailable, "TIMED_OUT"),
    (socket.gaierror(-2, "Name or service not known"), LedgerUnavailable, "HOST_NOT_FOUND"),
    (
        asyncpg.InvalidPasswordError('password authentication failed for user "x"'),
        LedgerCredentialsRejected,
        "CREDENTIALS_REJECTED",
    ),
    (
        asyncpg.InvalidAuthorizationSpecificationError("no pg_hba.conf entry"),
        LedgerCredentialsRejected,
        "CREDENTIALS_REJECTED",
    ),
    (
        asyncpg.InvalidCatalogNameError('database "x" does not exist'),
        LedgerRefused,
        "DATABASE_MISSING",
    ),
    (
        asyncpg.CannotConnectNowError("the database system is shutting down"),
        LedgerUnavailable,
        "SERVER_STARTING",
    ),
    (asyncpg.AdminShutdownError("terminating connection"), LedgerUnavailable, "SERVER_STOPPING"),
    (asyncpg.ConnectionDoesNotExistError("closed"), LedgerUnavailable, "CONNECTION_LOST"),
    (asyncpg.ConnectionFailureError("failure"), LedgerUnavailable, "CONNECTION_LOST"),
    (asyncpg.TooManyConnectionsError("too many"), LedgerUnavailable, "TOO_MANY_CONNECTIONS"),
    (
        asyncpg.InternalClientError("another operation is in progress"),
        LedgerUnavailable,
        "CONNECTION_LOST",
    ),
    (asyncpg.InterfaceError("connection is closed"), LedgerUnavailable, "CONNECTION_LOST"),
    (asyncpg.InterfaceError("pool is closing"), LedgerClosed, "POOL_CLOSED"),
    (asyncpg.ReadOnlySQLTransactionError("read-only"), LedgerRefused, "READ_ONLY"),
    (asyncpg.InsufficientPrivilegeError("denied"), LedgerRefused, "PERMISSION_DENIED"),
    (asyncpg.DiskFullError("no space"), LedgerRefused, "DISK_FULL"),
    (asyncpg.QueryCanceledError("statement timeout"), LedgerRefused, "STATEMENT_TIMEOUT"),
    (asyncpg.UntranslatableCharacterError("\\u0000"), LedgerRefused, "DATABASE_ERROR"),
    (
        DBAPIError("SELECT 1", None, asyncpg.ReadOnlySQLTransactionError("ro")),
        LedgerRefused,
        "READ_ONLY",
    ),
    (
        OperationalError("connect", None, ConnectionRefusedError(111, "refused")),
        LedgerUnavailable,
        "CONNECTION_REFUSED",
    ),
]


@pytest.mark.parametrize(("exc", "family", "code"), CASES, ids=lambda v: repr(v)[:40])
def test_translate_maps_each_failure(
    exc: BaseException, family: type[ContextLedgerError], code: str
) -> None:
    typed = translate(exc)
    assert type(typed) is family
    assert typed.code == code
    assert typed.is_retryable is (family is LedgerUnavailable)
    assert type(getattr(exc, "orig", exc)).__name__ in str(typed)


@pytest.mark.parametrize(
    "exc",
    [
        ConcurrencyError("x"),
        SessionNotFound.for_session("s"),
        ValueError("a bug"),
        KeyError("k"),
        asyncio.CancelledError(),
        asyncpg.ClientConfigurationError("bad argument"),
    ],
    ids=repr,
)
def test_translate_leaves_others_alone(exc: BaseException) -> None:
    assert translate(exc) is None


async def test_decorator_raises_typed_and_passes_ours() -> None:
    @translated
    async def down() -> int:
        raise FileNotFoundError(2, "gone")

    @translated
    async def conflict() -> int:
        raise ConcurrencyError("head moved")

    with pytest.raises(LedgerUnavailable) as info:
        await down()
    assert isinstance(info.value.__cause__, FileNotFoundError)
    with pytest.raises(ConcurrencyError):
        await conflict()


@pytest.mark.parametrize("size", [0, -1, True, 2.5, "10", None])
async def test_bad_pool_size_is_invalid_argument(size: object) -> None:
    with pytest.raises(InvalidArgument) as info:
        await Ledger.open("memory://", pool_size=size)  # type: ignore[arg-type]
    assert info.value.details["field"] == "pool_size"
