"""The error tree: every error belongs to one group, and HTTP maps the groups."""

from __future__ import annotations

import asyncio
import json

import pytest
from starlette.requests import Request

from contextledger import errors as e
from contextledger.http.problems import RETRY_AFTER_S, ledger_error, status_of

GROUPS = (
    e.InvalidInput,
    e.NotFound,
    e.Conflict,
    e.StoreError,
    e.IntegrityFailure,
    e.CompactionError,
    e.MissingExtra,
)


def _leaves(cls: type[e.ContextLedgerError]) -> set[type[e.ContextLedgerError]]:
    found = set()
    for sub in cls.__subclasses__():
        found.add(sub)
        found |= _leaves(sub)
    return found


def _make(cls: type[e.ContextLedgerError], code: str | None = None) -> e.ContextLedgerError:
    if cls is e.CompactionError:
        return e.CompactionError("x", code=code or "NO_TOKEN_BUDGET")
    return cls("x", code=code) if code else cls("x")


def test_every_error_is_in_exactly_one_group() -> None:
    for cls in _leaves(e.ContextLedgerError):
        if cls.__module__ != e.__name__:
            continue  # adapters' own subclasses inherit a group from their base
        assert sum(issubclass(cls, g) for g in GROUPS) == 1, cls


EXPECTED = {
    e.InvalidMessage: 422,
    e.InvalidArgument: 422,
    e.ConfigError: 422,
    e.InvalidImport: 422,
    e.SeqOutOfRange: 422,
    e.SessionNotFound: 404,
    e.CheckpointNotFound: 404,
    e.ConcurrencyError: 409,
    e.IdempotencyConflict: 409,
    e.SessionExists: 409,
    e.LedgerUnavailable: 503,
    e.LedgerRefused: 503,
    e.LedgerCredentialsRejected: 503,
    e.LedgerClosed: 503,
    e.MigrationRequired: 503,
    e.ChainBroken: 500,
    e.EventDecodeError: 500,
    e.MissingExtra: 500,
}


@pytest.mark.parametrize(
    ("cls", "status"), EXPECTED.items(), ids=lambda v: getattr(v, "__name__", v)
)
def test_status_by_group(cls: type[e.ContextLedgerError], status: int) -> None:
    assert status_of(_make(cls)) == status


def test_no_error_of_ours_is_a_400() -> None:
    """A new class inherits its group's status; one outside every group is our fault."""
    for cls in _leaves(e.ContextLedgerError) | {e.ContextLedgerError}:
        if cls.__module__ == e.__name__:
            assert status_of(_make(cls)) != 400, cls

    class Unfiled(e.ContextLedgerError):
        """Outside every group."""

    assert status_of(Unfiled("x")) == 500


@pytest.mark.parametrize(
    ("exc", "status", "retry_after"),
    [
        (e.LedgerUnavailable("down", code="CONNECTION_REFUSED"), 503, str(RETRY_AFTER_S)),
        (e.LedgerRefused("full", code="DISK_FULL"), 503, None),
        (e.LedgerRefused("slow", code="STATEMENT_TIMEOUT"), 503, None),
        (e.LedgerCredentialsRejected("who", code="CREDENTIALS_REJECTED"), 503, None),
        (e.EventDecodeError("newer", code="EVENT_FROM_NEWER_CODE"), 500, None),
        (e.ChainBroken("bad"), 500, None),
        (e.CompactionError("all failed", code="ALL_MODELS_FAILED"), 503, str(RETRY_AFTER_S)),
        (e.CompactionError("no budget", code="NO_TOKEN_BUDGET"), 422, None),
        (e.ConcurrencyError("late"), 409, None),
    ],
    ids=lambda v: getattr(v, "code", v),
)
def test_problem_status_code_and_retry_after(
    exc: e.ContextLedgerError, status: int, retry_after: str | None
) -> None:
    request = Request({"type": "http", "method": "GET", "path": "/x", "headers": []})
    response = asyncio.run(ledger_error(request, exc))
    assert response.status_code == status
    assert response.headers.get("retry-after") == retry_after
    body = json.loads(bytes(response.body))
    assert body["code"] == exc.code and body["status"] == status
    if isinstance(exc, e.StoreError | e.EventDecodeError):  # details stay in the log
        assert exc.args[0] not in body["detail"]
