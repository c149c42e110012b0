"""contextledger: an LLM agent's memory as an append-only event ledger in PostgreSQL.

Everything public is re-exported here; the modules behind it are private.
"""

from .errors import (
    CheckpointNotFound,
    CompactionError,
    ConcurrencyError,
    ConfigError,
    ContextLedgerError,
    IdempotencyConflict,
    InvalidArgument,
    InvalidMessage,
    LedgerClosed,
    LedgerUnavailable,
    MigrationRequired,
    SeqOutOfRange,
    SessionExists,
    SessionNotFound,
)
from .events import Event
from .ledger.store import Checkpoint, RebuildReport, SessionInfo, VerifyReport
from .protocols import ContextManager
from .session import Ledger, ManageResult, Session
from .tokens import TokenCounter
from .view import ViewItem

__all__ = [
    "Checkpoint",
    "CheckpointNotFound",
    "CompactionError",
    "ConcurrencyError",
    "ConfigError",
    "ContextLedgerError",
    "ContextManager",
    "Event",
    "IdempotencyConflict",
    "InvalidArgument",
    "InvalidMessage",
    "Ledger",
    "LedgerClosed",
    "LedgerUnavailable",
    "ManageResult",
    "MigrationRequired",
    "RebuildReport",
    "SeqOutOfRange",
    "Session",
    "SessionExists",
    "SessionInfo",
    "SessionNotFound",
    "TokenCounter",
    "VerifyReport",
    "ViewItem",
]
