"""Errors as ``application/problem+json`` (RFC 9457), carrying our stable ``code``.

One table maps each ``ContextLedgerError`` class to an HTTP status; the body is
``{type, title, status, detail, code, ...details}`` so clients branch on ``code``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from contextledger import errors as e

MEDIA_TYPE = "application/problem+json"
STATUS: dict[type[e.ContextLedgerError], int] = {
    e.InvalidMessage: 422,
    e.InvalidArgument: 422,
    e.ConfigError: 422,
    e.SeqOutOfRange: 422,
    e.SessionNotFound: 404,
    e.CheckpointNotFound: 404,
    e.ConcurrencyError: 409,
    e.IdempotencyConflict: 409,
    e.SessionExists: 409,
    e.SessionHasForks: 409,
    e.LedgerUnavailable: 503,
    e.MigrationRequired: 503,
    e.LedgerClosed: 503,
}


class Problem(Exception):
    """An HTTP-level problem of our own (authentication, a missing header, ...)."""

    def __init__(self, status: int, code: str, detail: str, **extra: Any) -> None:
        super().__init__(detail)
        self.status, self.code, self.detail, self.extra = status, code, detail, extra


def status_of(exc: e.ContextLedgerError) -> int:
    for cls in type(exc).__mro__:
        if cls in STATUS:
            return STATUS[cls]
    if isinstance(exc, e.CompactionError):
        return 503 if exc.is_retryable else 422
    return 400


def problem(status: int, code: str, detail: str, **extra: Any) -> JSONResponse:
    body = {
        "type": f"https://contextledger.dev/problems/{code.lower().replace('_', '-')}",
        "title": code.replace("_", " ").capitalize(),
        "status": status,
        "detail": detail,
        "code": code,
    }
    body.update({k: v for k, v in extra.items() if k not in body and _jsonable(v)})
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    return JSONResponse(body, status_code=status, media_type=MEDIA_TYPE, headers=headers)


def _jsonable(value: Any) -> bool:
    return value is None or isinstance(value, str | int | float | bool | list | dict)


#: Failures of the database (or of what it holds), not of the request: the client gets
#: a 503 and a generic detail; what failed, with its host, user, SQL state or DSN, goes
#: to the log only.
DATABASE_FAILURES: tuple[type[e.ContextLedgerError], ...] = (
    e.LedgerUnavailable,
    e.LedgerRefused,
    e.MigrationRequired,
    e.LedgerClosed,
    e.EventDecodeError,
)


async def ledger_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, e.ContextLedgerError)
    if isinstance(exc, DATABASE_FAILURES):
        import structlog

        structlog.get_logger(__name__).error(
            "database_failure", path=request.url.path, code=exc.code, error=str(exc)
        )
        return problem(
            503,
            exc.code,
            "the database is unavailable or failed; retry shortly (the service log says why)",
        )
    return problem(status_of(exc), exc.code, str(exc.args[0]), **exc.details)


async def own_problem(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, Problem)
    return problem(exc.status, exc.code, exc.detail, **exc.extra)


async def validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = [
        {"loc": [str(p) for p in err.get("loc", ())], "msg": str(err.get("msg", ""))}
        for err in exc.errors()
    ]
    first = errors[0] if errors else {"loc": [], "msg": "invalid request"}
    return problem(
        422, "INVALID_REQUEST", f"{'.'.join(first['loc'])}: {first['msg']}", errors=errors
    )


async def http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    code = {404: "NOT_FOUND", 405: "METHOD_NOT_ALLOWED"}.get(exc.status_code, "HTTP_ERROR")
    return problem(exc.status_code, code, str(exc.detail))


async def unexpected_error(request: Request, exc: Exception) -> JSONResponse:
    import structlog

    structlog.get_logger(__name__).exception("unhandled_error", path=request.url.path)
    return problem(500, "INTERNAL_ERROR", "an unexpected error; see the service log")


async def too_deep(request: Request, exc: Exception) -> JSONResponse:
    """JSON nested past the parser's depth (``RecursionError``): the client's error."""
    return problem(400, "INVALID_REQUEST", "the body is nested too deeply")


Handler = Callable[[Request, Exception], Awaitable[JSONResponse]]
#: The exceptions rendered as a problem where they are raised (starlette's
#: ExceptionMiddleware); anything else is ``unexpected_error``'s, outermost.
HANDLERS: tuple[tuple[type[Exception], Handler], ...] = (
    (e.ContextLedgerError, ledger_error),
    (Problem, own_problem),
    (RequestValidationError, validation_error),
    (StarletteHTTPException, http_error),
    (RecursionError, too_deep),
)


def handler_for(exc: Exception) -> Handler | None:
    """The handler ``install`` registers for ``exc`` (None: it goes to ``unexpected_error``)."""
    for cls, handler in HANDLERS:
        if isinstance(exc, cls):
            return handler
    return None


def install(app: Any) -> None:
    for cls, handler in HANDLERS:
        app.add_exception_handler(cls, handler)
    app.add_exception_handler(Exception, unexpected_error)
