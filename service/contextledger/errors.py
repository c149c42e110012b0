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
    code = "SESSION_NOT_FOUND"


class SessionExists(ContextLedgerError):
    code = "SESSION_EXISTS"


class CheckpointNotFound(ContextLedgerError):
    code = "CHECKPOINT_NOT_FOUND"


class SeqOutOfRange(ContextLedgerError):
    code = "SEQ_OUT_OF_RANGE"


class MigrationRequired(ContextLedgerError):
    """The database schema is not at the version this code needs."""

    code = "MIGRATION_REQUIRED"


class LedgerUnavailable(ContextLedgerError):
    """The store could not be reached or started."""

    code = "LEDGER_UNAVAILABLE"
    is_retryable = True


class LedgerClosed(ContextLedgerError):
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
