"""The PostgreSQL store: asyncpg on the hot path, one round trip per message append.

A package by concept (``statements``: shared SQL and row mappers; ``connections``: pools
and hot connections; ``tips``: per-session chain tips, locks and closed gates;
``appends``; ``reads``; ``search``: lexical recall; ``vectors``: embeddings; ``store``:
``PostgresStore`` assembled from them). The names below are the ones code outside the
package uses; import them from here.
"""

from contextledger.store.postgres.lexemes import INDEX_TEXT_CONFIG, SEARCH_VECTOR
from contextledger.store.postgres.search import (
    CLOSED,
    MAX_GATE_GAPS,
    MAX_REMEMBERED,
    RECHECK_AFTER,
    SEARCH_POOL_BACKOFF,
    gate_gaps,
    search_sql,
    search_statement,
    seq_ranges,
)
from contextledger.store.postgres.statements import (
    APPEND_MESSAGE,
    APPEND_MESSAGE_CALL,
    APPEND_MESSAGES,
    APPEND_SESSION_MESSAGES,
    READ_VIEW,
    S,
)
from contextledger.store.postgres.store import PostgresStore
from contextledger.store.postgres.tips import MAX_HEADS

__all__ = [
    "APPEND_MESSAGE",
    "APPEND_MESSAGES",
    "APPEND_MESSAGE_CALL",
    "APPEND_SESSION_MESSAGES",
    "CLOSED",
    "INDEX_TEXT_CONFIG",
    "MAX_GATE_GAPS",
    "MAX_HEADS",
    "MAX_REMEMBERED",
    "READ_VIEW",
    "RECHECK_AFTER",
    "SEARCH_POOL_BACKOFF",
    "SEARCH_VECTOR",
    "PostgresStore",
    "S",
    "gate_gaps",
    "search_sql",
    "search_statement",
    "seq_ranges",
]
