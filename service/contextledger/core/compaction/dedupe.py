"""Duplicate messages: an identical earlier copy adds tokens and no information.

Only plain messages qualify - same role and same content (compared as canonical
JSON). Tool calls and results never do: two results with the same text but
different ids answer different calls. System messages, critical items,
summaries and synthetic items are never candidates. The latest copy is kept,
because it sits where the conversation last relied on it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from contextledger.core.units import is_tool_message
from contextledger.core.view import Ref, ViewItem


def _key(item: ViewItem) -> str:
    return json.dumps(
        [item.role, item.message.get("content")], sort_keys=True, default=str, ensure_ascii=False
    )


def duplicate_refs(items: Sequence[ViewItem]) -> tuple[Ref, ...]:
    """Refs of earlier copies of identical plain messages, in view order. O(total size)."""
    seen: set[str] = set()
    dupes: list[Ref] = []
    for item in reversed(items):
        if (
            item.role == "system"
            or item.critical
            or item.kind in ("summary", "synthetic")
            or is_tool_message(item.message)
        ):
            continue
        key = _key(item)
        if key in seen:
            dupes.append(item.ref)
        else:
            seen.add(key)
    dupes.reverse()
    return tuple(dupes)
