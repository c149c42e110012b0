"""Typed errors. Every failure a caller can act on has a class and a stable ``code``.

Callers branch on ``code`` (a string that never changes meaning) rather than on
message text; ``details`` carries the figures that explain the failure.
"""

from __future__ import annotations

from typing import Any


class ContextLedgerError(Exception):
    """Base of every error contextledger raises on purpose."""

    code: str = "CONTEXTLEDGER_ERROR"
    is_retryable: bool = False

    def __init__(self, message: str, *, code: str | None = None, **details: Any) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code
        self.details: dict[str, Any] = details

    def __str__(self) -> str:
        return f"[{self.code}] {self.args[0]}"


class InvalidMessage(ContextLedgerError):
    """A message was rejected before anything was written; ``field`` says where."""

    code = "INVALID_MESSAGE"


class InvalidArgument(ContextLedgerError):
    """An argument to a public call is out of range or of the wrong type."""

    code = "INVALID_ARGUMENT"


class ConfigError(ContextLedgerError):
    """A configuration key is unknown or its value is invalid; ``key`` names it."""

    code = "INVALID_CONFIG"


class ConcurrencyError(ContextLedgerError):
    """``expected_seq`` did not match the session head: someone else wrote first."""

    code = "CONCURRENCY_CONFLICT"
    is_retryable = True


class IdempotencyConflict(ContextLedgerError):
    """An idempotency key was reused for a different event."""

    code = "IDEMPOTENCY_CONFLICT"


class SessionNotFound(ContextLedgerError):
    """No session with that id exists in this ledger (or it was purged)."""

    code = "SESSION_NOT_FOUND"

    @classmethod
    def for_session(cls, session_id: str) -> SessionNotFound:
        return cls(f"no session {session_id!r}", session_id=session_id)


class SessionExists(ContextLedgerError):
    """A session with that id already exists (``create_session`` only)."""

    code = "SESSION_EXISTS"


class SessionHasForks(ContextLedgerError):
    """The session cannot be purged: forks stand on its events (``forks`` names them).

    A fork reads its prefix from its parent, so the parent goes only after its forks."""

    code = "SESSION_HAS_FORKS"


class CheckpointNotFound(ContextLedgerError):
    """The checkpoint named (by object, label or seq) is not one of this session's."""

    code = "CHECKPOINT_NOT_FOUND"


class SeqOutOfRange(ContextLedgerError):
    """A seq outside the session's 1..head range."""

    code = "SEQ_OUT_OF_RANGE"


class ChainBroken(ContextLedgerError):
    """A session's hash chain does not verify (or no longer reaches an anchor).

    ``rebuild`` refuses to copy a view derived from such a chain unless forced.
    """

    code = "CHAIN_BROKEN"


class InvalidImport(ContextLedgerError):
    """An export file did not check out (bad JSON, a missing field, a gap, a broken
    hash); ``line`` names the first bad line. Nothing was written."""

    code = "INVALID_IMPORT"


class MigrationRequired(ContextLedgerError):
    """The database schema is not at the version this code needs."""

    code = "MIGRATION_REQUIRED"


class LedgerUnavailable(ContextLedgerError):
    """The store could not be reached or started; retrying later may succeed.

    Codes: ``LEDGER_UNAVAILABLE`` (generic), ``CONNECTION_LOST``,
    ``CONNECTION_REFUSED``, ``SERVER_STARTING``, ``SERVER_STOPPING``,
    ``POOL_CLOSED``, ``TOO_MANY_CONNECTIONS``.
    """

    code = "LEDGER_UNAVAILABLE"
    is_retryable = True


class LedgerRefused(ContextLedgerError):
    """The server refused the operation; retrying unchanged will not help.

    Codes: ``READ_ONLY``, ``PERMISSION_DENIED``, ``DISK_FULL``,
    ``STATEMENT_TIMEOUT``, ``DATABASE_ERROR`` (any other server error).
    """

    code = "DATABASE_ERROR"


class EventDecodeError(ContextLedgerError):
    """A stored event cannot be read by this code.

    Codes: ``UNKNOWN_EVENT_TYPE``, ``EVENT_FROM_NEWER_CODE``, ``NO_UPCASTER``.
    """

    code = "EVENT_DECODE_FAILED"


class MissingExtra(ContextLedgerError, ImportError):
    """A part of contextledger was used whose optional packages are not installed;
    ``extra`` names the ``pip install 'contextledger[extra]'`` that adds them."""

    code = "MISSING_EXTRA"


class LedgerClosed(ContextLedgerError):
    """The ledger (or the session's ledger) was closed; open a new one."""

    code = "LEDGER_CLOSED"


class CompactionError(ContextLedgerError):
    """Compaction or summarization could not produce an acceptable view.

    Codes: ``INVALID_SUMMARY``, ``CONTEXT_GROWTH``, ``ALL_MODELS_FAILED``,
    ``NO_TOKEN_BUDGET``, ``MIN_MESSAGES_NOT_MET``.
    """

    code = "COMPACTION_FAILED"
    _RETRYABLE = frozenset({"ALL_MODELS_FAILED", "INVALID_SUMMARY"})

    def __init__(self, message: str, *, code: str, model: str | None = None, **details: Any):
        super().__init__(message, code=code, model=model, **details)
        self.model = model
        self.is_retryable = code in self._RETRYABLE
