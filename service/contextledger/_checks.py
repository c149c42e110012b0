"""Argument validation shared by the ledger, its sessions and the Amplifier mount.

Every public entry point checks its arguments here before anything is written, so a
rejected call raises a typed error (``InvalidArgument`` / ``InvalidMessage``) and
leaves the ledger untouched.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Mapping
from typing import Any

from contextledger.core.messages import copy_json
from contextledger.errors import InvalidArgument, InvalidMessage

MAX_SESSION_ID = 200
MAX_TOKENS = 2**31 - 1  # the ledger's token columns are 32-bit
MAX_SEQ = 2**63 - 1


def check_text(value: Any, name: str, *, limit: int = 200) -> str:
    """A short identifier: non-empty, printable to UTF-8, no NUL (PostgreSQL text)."""
    if not isinstance(value, str) or not value.strip() or len(value) > limit or "\x00" in value:
        raise InvalidArgument(
            f"{name} must be a non-empty string of at most {limit} characters, without NUL",
            field=name,
        )
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidArgument(f"{name} is not valid Unicode", field=name) from None
    return value


def check_session_id(session_id: Any) -> str:
    return check_text(session_id, "session_id", limit=MAX_SESSION_ID)


#: Format characters that reorder what follows them on screen (bidirectional overrides
#: and isolates, the implicit marks): in an id they make one session read as another in
#: a table, a log line or the audit page ("Trojan Source").
_BIDI = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


def check_new_session_id(session_id: Any) -> str:
    """``check_session_id`` for an id a session is created under: also no control
    characters (a newline splits a log line, an escape sequence drives a terminal) and
    no bidirectional controls. Only new ids: one already in a ledger stays reachable."""
    value = check_session_id(session_id)
    bad = next(
        (c for c in value if unicodedata.category(c) == "Cc" or c in _BIDI),
        None,
    )
    if bad is not None:
        raise InvalidArgument(
            f"session_id must not contain control or bidirectional characters"
            f" (found U+{ord(bad):04X})",
            field="session_id",
        )
    return value


def check_key(key: Any) -> str | None:
    return None if key is None else check_text(key, "idempotency_key")


def check_seq(value: Any, name: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_SEQ:
        raise InvalidArgument(f"{name} must be an int in 0..2**63-1", field=name)
    return value


def check_mapping(value: Any, name: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InvalidArgument(f"{name} must be a dict, not {type(value).__name__}", field=name)
    try:
        copied: dict[str, Any] = copy_json(dict(value), name)
    except InvalidMessage as exc:
        raise InvalidArgument(str(exc.args[0]), field=name) from None
    return copied


def checked_tokens(tokens: int) -> int:
    if tokens > MAX_TOKENS:
        raise InvalidMessage(
            f"the message counts {tokens} tokens; the ledger holds at most "
            f"{MAX_TOKENS} per message (check the token counter's ratio)",
            field="tokens",
        )
    return tokens
