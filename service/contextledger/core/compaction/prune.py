"""Tool-output pruning: cut a long tool result to its head instead of dropping its unit.

One huge early result (a file dump, a log) is usually what pushes a view over
budget; keeping its head and the call keeps the story intact at a fraction of
the cost. Decision: the head kept is ``max_tool_output_chars // 2`` characters
(cut back to a line break when one is in its second half), so a pruned result
lands well under the limit and is visibly a head; the marker
``[truncated: ~N tokens]`` says how many tokens (by the counter in use) were
removed. A text carrying the marker is never pruned again. Results of
``protected_tools`` (named by their call, or by the result's ``name``), the last
``protect_recent_tool_results`` results and critical items are never pruned.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from contextledger.core.config import ContextConfig
from contextledger.core.tokens import TokenCounter
from contextledger.core.units import result_ids, tool_calls
from contextledger.core.view import Ref, ViewItem

MARKER_RE = re.compile(r"\[truncated: ~\d+ tokens\]")


def marker(removed_tokens: int) -> str:
    return f"[truncated: ~{removed_tokens} tokens]"


def is_pruned(text: str) -> bool:
    return MARKER_RE.search(text) is not None


def _head(text: str, keep: int) -> str:
    head = text[:keep]
    cut = head.rfind("\n")
    return head[: cut + 1] if cut >= keep // 2 else head


def prune_text_content(content: Any, *, max_chars: int, counter: TokenCounter) -> Any | None:
    """A pruned copy of tool-result ``content`` (a string or a list of blocks), or None.

    None when the text is within ``max_chars``, already carries a marker, or is not
    text. Non-text blocks (images) are kept as they are.
    """
    keep = max_chars // 2
    if isinstance(content, str):
        if len(content) <= max_chars or is_pruned(content):
            return None
        head = _head(content, keep)
        removed = counter.count_text(content[len(head) :])
        return f"{head}\n{marker(removed)}"
    if not isinstance(content, Sequence):
        return None
    texts = [
        b["text"]
        for b in content
        if isinstance(b, Mapping) and b.get("type") == "text" and isinstance(b.get("text"), str)
    ]
    if sum(len(t) for t in texts) <= max_chars or any(is_pruned(t) for t in texts):
        return None
    out: list[Any] = []
    removed_text: list[str] = []
    room = keep
    for block in content:
        if not (
            isinstance(block, Mapping)
            and block.get("type") == "text"
            and isinstance(block.get("text"), str)
        ):
            out.append(block)
            continue
        text: str = block["text"]
        if room <= 0:
            removed_text.append(text)
        elif len(text) <= room:
            out.append(block)
            room -= len(text)
        else:
            head = _head(text, room)
            out.append({**block, "text": head})
            removed_text.append(text[len(head) :])
            room = 0
    removed = counter.count_text("".join(removed_text))
    out.append({"type": "text", "text": marker(removed)})
    return out


def prune_tool_outputs(
    items: Sequence[ViewItem], *, config: ContextConfig, counter: TokenCounter
) -> dict[Ref, Mapping[str, Any]]:
    """Replacement messages for items whose tool output exceeds ``max_tool_output_chars``."""
    names: dict[str, str] = {}
    for item in items:
        for call_id, name in tool_calls(item.message):
            names[call_id] = name
    # the last ``protect_recent_tool_results`` result ids, counted block by block
    recent: set[tuple[int, str]] = set()
    budget = config.protect_recent_tool_results
    for pos in range(len(items) - 1, -1, -1):
        if budget <= 0:
            break
        for call_id in reversed(result_ids(items[pos].message)):
            if budget <= 0:
                break
            recent.add((pos, call_id))
            budget -= 1
    protected_tools = set(config.protected_tools)
    limit = config.max_tool_output_chars

    def protected(pos: int, call_id: str, own_name: object) -> bool:
        name = names.get(call_id) or (own_name if isinstance(own_name, str) else "")
        return (pos, call_id) in recent or name in protected_tools

    out: dict[Ref, Mapping[str, Any]] = {}
    for pos, item in enumerate(items):
        message = item.message
        if item.critical or item.role == "system":
            continue
        if message.get("role") == "tool":
            raw_id = message.get("tool_call_id")
            call_id = raw_id if isinstance(raw_id, str) else ""
            if protected(pos, call_id, message.get("name")):
                continue
            content = prune_text_content(message.get("content"), max_chars=limit, counter=counter)
            if content is not None:
                out[item.ref] = {**message, "content": content}
            continue
        if not result_ids(message):
            continue
        blocks = message.get("content")
        assert isinstance(blocks, Sequence)
        new_blocks: list[Any] = []
        changed = False
        for block in blocks:
            if isinstance(block, Mapping) and block.get("type") == "tool_result":
                use_id = block.get("tool_use_id")
                use_id = use_id if isinstance(use_id, str) else ""
                if not protected(pos, use_id, block.get("name")):
                    content = prune_text_content(
                        block.get("content"), max_chars=limit, counter=counter
                    )
                    if content is not None:
                        new_blocks.append({**block, "content": content})
                        changed = True
                        continue
            new_blocks.append(block)
        if changed:
            out[item.ref] = {**message, "content": new_blocks}
    # only keep replacements that really save tokens under this counter
    if not out:
        return out
    before = {item.ref: item.tokens for item in items if item.ref in out}
    return {ref: m for ref, m in out.items() if counter.count_message(m) < before[ref]}
