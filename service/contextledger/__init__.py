"""contextledger: an LLM agent's memory as an append-only event ledger in PostgreSQL.

Everything public is re-exported here (``tests/unit/test_public_api.py`` pins the
list); the modules behind it are internal and may move.
"""

import contextledger._litellm  # noqa: F401  (fills core's catalogue: model map, tokenizer files)
from contextledger.compactor import PRE_COMPACT_LABEL, ManageResult
from contextledger.core.budget import Budget, Pressure, PressureThresholds, Usage
from contextledger.core.chain import Anchor, VerifyReport
from contextledger.core.config import STRATEGIES, ContextConfig, SummarizerConfig, SummarizerModel
from contextledger.core.events import Event
from contextledger.core.model_limits import ModelLimits
from contextledger.core.tokens import TokenCounter
from contextledger.core.view import ViewItem
from contextledger.errors import (
    ChainBroken,
    CheckpointNotFound,
    CompactionError,
    ConcurrencyError,
    ConfigError,
    Conflict,
    ContextLedgerError,
    EventDecodeError,
    IdempotencyConflict,
    IntegrityFailure,
    InvalidArgument,
    InvalidImport,
    InvalidInput,
    InvalidMessage,
    KeyUnavailable,
    LedgerClosed,
    LedgerCredentialsRejected,
    LedgerRefused,
    LedgerUnavailable,
    MigrationRequired,
    MissingExtra,
    NotFound,
    SeqOutOfRange,
    SessionErased,
    SessionExists,
    SessionHasForks,
    SessionNotEncrypted,
    SessionNotFound,
    StoreError,
)
from contextledger.hooks import (
    HOOK_EVENTS,
    INCLUDE,
    MESSAGE_ADDED,
    OVERFLOW,
    POST_COMPACT,
    PRE_COMPACT,
    SUMMARIZATION,
    CompactContext,
    CompactDecision,
    HookBus,
)
from contextledger.ledger import Ledger, warm_up
from contextledger.log_setup import library_defaults as _library_defaults
from contextledger.owned import OwnedLedger
from contextledger.protocols import ContextManager
from contextledger.provider_shapes import ProviderRequest
from contextledger.retry import RetryPolicy
from contextledger.session import Session
from contextledger.store.base import Checkpoint, Erasure, RebuildReport, SessionInfo
from contextledger.store.sealing import KeyRing
from contextledger.summarizer import FallbackCallback

_library_defaults()

__all__ = [
    "HOOK_EVENTS",
    "INCLUDE",
    "MESSAGE_ADDED",
    "OVERFLOW",
    "POST_COMPACT",
    "PRE_COMPACT",
    "PRE_COMPACT_LABEL",
    "STRATEGIES",
    "SUMMARIZATION",
    "Anchor",
    "Budget",
    "ChainBroken",
    "Checkpoint",
    "CheckpointNotFound",
    "CompactContext",
    "CompactDecision",
    "CompactionError",
    "ConcurrencyError",
    "ConfigError",
    "Conflict",
    "ContextConfig",
    "ContextLedgerError",
    "ContextManager",
    "Erasure",
    "Event",
    "EventDecodeError",
    "FallbackCallback",
    "HookBus",
    "IdempotencyConflict",
    "IntegrityFailure",
    "InvalidArgument",
    "InvalidImport",
    "InvalidInput",
    "InvalidMessage",
    "KeyRing",
    "KeyUnavailable",
    "Ledger",
    "LedgerClosed",
    "LedgerCredentialsRejected",
    "LedgerRefused",
    "LedgerUnavailable",
    "ManageResult",
    "MigrationRequired",
    "MissingExtra",
    "ModelLimits",
    "NotFound",
    "OwnedLedger",
    "Pressure",
    "PressureThresholds",
    "ProviderRequest",
    "RebuildReport",
    "RetryPolicy",
    "SeqOutOfRange",
    "Session",
    "SessionErased",
    "SessionExists",
    "SessionHasForks",
    "SessionInfo",
    "SessionNotEncrypted",
    "SessionNotFound",
    "StoreError",
    "SummarizerConfig",
    "SummarizerModel",
    "TokenCounter",
    "Usage",
    "VerifyReport",
    "ViewItem",
    "warm_up",
]
