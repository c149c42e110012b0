"""Typed errors. Every failure a caller can act on has a class and a stable ``code``.

Callers branch on ``code`` (a string that never changes meaning) rather than on
message text; ``details`` carries the figures that explain the failure. The classes
form a tree grouped by what a caller does about them, and the faces (HTTP, CLI) map
the groups, not the leaves::

    ContextLedgerError
    ├── InvalidInput            the caller's input: fix it      (HTTP 422)
    │   ├── InvalidMessage, InvalidArgument, ConfigError, InvalidImport, SeqOutOfRange
    ├── NotFound                no such thing                    (HTTP 404)
    │   ├── SessionNotFound, CheckpointNotFound
    ├── Conflict                someone else got there first     (HTTP 409)
    │   ├── ConcurrencyError (retryable), IdempotencyConflict, SessionExists
    ├── StoreError              the store cannot serve us        (HTTP 503; Retry-After
    │   │                                                         when retryable)
    │   ├── LedgerUnavailable   out of reach: retry later
    │   ├── LedgerRefused       the server said no: retrying unchanged will not help
    │   │   └── LedgerCredentialsRejected   wrong user/password: fix the DSN
    │   ├── LedgerClosed, MigrationRequired
    ├── IntegrityFailure        what is stored does not check out (HTTP 500)
    │   ├── ChainBroken, EventDecodeError
    ├── CompactionError         (HTTP 503 when retryable, else 422)
    └── MissingExtra            an optional package is missing   (HTTP 500)
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


class InvalidInput(ContextLedgerError):
    """Group: the caller's input is wrong (a message, an argument, a config, a file).
    Nothing was written; fix the input and call again."""

    code = "INVALID_INPUT"


class NotFound(ContextLedgerError):
    """Group: the session or checkpoint named does not exist."""

    code = "NOT_FOUND"


class Conflict(ContextLedgerError):
    """Group: the call collides with what is already recorded (another writer, a reused
    key, an existing id)."""

    code = "CONFLICT"


class StoreError(ContextLedgerError):
    """Group: the store cannot serve the call (out of reach, refusing, closed, or at
    another schema). The input was fine; ``is_retryable`` says whether waiting helps."""

    code = "STORE_ERROR"


class IntegrityFailure(ContextLedgerError):
    """Group: what the ledger holds does not check out (a broken hash chain, an event
    this code cannot read). Neither the caller's fault nor transient."""

    code = "INTEGRITY_FAILURE"


class InvalidMessage(InvalidInput):
    """A message was rejected before anything was written; ``field`` says where."""

    code = "INVALID_MESSAGE"


class InvalidArgument(InvalidInput):
    """An argument to a public call is out of range or of the wrong type."""

    code = "INVALID_ARGUMENT"


class ConfigError(InvalidInput):
    """A configuration key is unknown or its value is invalid; ``key`` names it."""

    code = "INVALID_CONFIG"


class ConcurrencyError(Conflict):
    """``expected_seq`` did not match the session head: someone else wrote first."""

    code = "CONCURRENCY_CONFLICT"
    is_retryable = True


class IdempotencyConflict(Conflict):
    """An idempotency key was reused for a different event."""

    code = "IDEMPOTENCY_CONFLICT"


class SessionNotFound(NotFound):
    """No session with that id exists in this ledger (or it was purged)."""

    code = "SESSION_NOT_FOUND"

    @classmethod
    def for_session(cls, session_id: str) -> SessionNotFound:
        return cls(f"no session {session_id!r}", session_id=session_id)


class SessionErased(SessionNotFound):
    """The session was erased (its data key destroyed): its content can never be read
    again. Its chain still verifies; ``erasures`` says who erased it, when and why."""

    code = "SESSION_ERASED"


class SessionNotEncrypted(Conflict):
    """``erase`` needs a session written under a data key; a session written without
    encryption can only be removed with the audited ``purge``."""

    code = "SESSION_NOT_ENCRYPTED"


class KeyUnavailable(ConfigError):
    """A data key cannot be unwrapped: no key-encryption key configured, or not the one
    (nor an old one still listed) it was wrapped under. The operator's configuration,
    not the caller's input: the service answers 503."""

    code = "KEY_UNAVAILABLE"


class SessionExists(Conflict):
    """A session with that id already exists (``create_session`` only)."""

    code = "SESSION_EXISTS"


class SessionHasForks(Conflict):
    """The session cannot be purged: forks stand on its events (``forks`` names them).

    A fork reads its prefix from its parent, so the parent goes only after its forks."""

    code = "SESSION_HAS_FORKS"


class CheckpointNotFound(NotFound):
    """The checkpoint named (by object, label or seq) is not one of this session's."""

    code = "CHECKPOINT_NOT_FOUND"


class SeqOutOfRange(InvalidInput):
    """A seq outside the session's 1..head range."""

    code = "SEQ_OUT_OF_RANGE"


class ChainBroken(IntegrityFailure):
    """A session's hash chain does not verify (or no longer reaches an anchor).

    ``rebuild`` refuses to copy a view derived from such a chain unless forced.
    """

    code = "CHAIN_BROKEN"


class InvalidImport(InvalidInput):
    """An export file did not check out (bad JSON, a missing field, a gap, a broken
    hash); ``line`` names the first bad line. Nothing was written."""

    code = "INVALID_IMPORT"


class MigrationRequired(StoreError):
    """The database schema is not at the version this code needs."""

    code = "MIGRATION_REQUIRED"


class LedgerUnavailable(StoreError):
    """The store could not be reached or started; retrying later may succeed.

    Codes: ``LEDGER_UNAVAILABLE`` (generic), ``CONNECTION_LOST``,
    ``CONNECTION_REFUSED`` (nothing listens at the host and port), ``HOST_NOT_FOUND``
    (the host name does not resolve: a typo, or the name service is down),
    ``TIMED_OUT`` (no answer in time), ``SERVER_STARTING``, ``SERVER_STOPPING``,
    ``TOO_MANY_CONNECTIONS``.
    """

    code = "LEDGER_UNAVAILABLE"
    is_retryable = True


class LedgerRefused(StoreError):
    """The server refused the operation; retrying unchanged will not help.

    Codes: ``READ_ONLY``, ``PERMISSION_DENIED``, ``DISK_FULL``,
    ``STATEMENT_TIMEOUT``, ``DATABASE_MISSING`` (the DSN names a database the server
    does not have), ``DATABASE_ERROR`` (any other server error).
    """

    code = "DATABASE_ERROR"


class LedgerCredentialsRejected(LedgerRefused):
    """The server rejected the login: the user, its password (or the client certificate)
    or ``pg_hba.conf`` does not let this DSN in. Never "unreachable": retrying, or falling
    back to another store, would hide a configuration mistake. Code:
    ``CREDENTIALS_REJECTED``."""

    code = "CREDENTIALS_REJECTED"


class EventDecodeError(IntegrityFailure):
    """A stored event cannot be read by this code.

    Codes: ``UNKNOWN_EVENT_TYPE``, ``EVENT_FROM_NEWER_CODE``, ``NO_UPCASTER``.
    """

    code = "EVENT_DECODE_FAILED"


class MissingExtra(ContextLedgerError, ImportError):
    """A part of contextledger was used whose optional packages are not installed;
    ``extra`` names the ``pip install 'contextledger-pg[extra]'`` that adds them."""

    code = "MISSING_EXTRA"


class LedgerClosed(StoreError):
    """The ledger (or the session's ledger) was closed; open a new one. ``POOL_CLOSED``:
    a call that was already at the database when it closed."""

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
