"""Terminal rendering shared by the CLI and the demo (rich)."""

from __future__ import annotations

import json
from typing import Any

from rich.markup import escape
from rich.table import Table


def short(message: Any, width: int = 70) -> str:
    """One line for a message of any shape: text, tool calls, content blocks."""
    content = message.get("content")
    if content is None and message.get("tool_calls"):
        names = [c.get("function", {}).get("name", "?") for c in message["tool_calls"]]
        text = f"→ calls {', '.join(names)}"
    elif isinstance(content, list):
        parts = []
        for block in content:
            kind = block.get("type")
            if kind == "text":
                parts.append(str(block.get("text", "")))
            elif kind == "tool_use":
                parts.append(f"→ {block.get('name')}({json.dumps(block.get('input'))})")
            elif kind == "tool_result":
                parts.append(f"← {block.get('content')!s}")
            else:
                parts.append(f"[{kind}]")
        text = " ".join(parts)
    else:
        text = str(content)
    text = text.replace("\n", " ")
    return text if len(text) <= width else text[: width - 1] + "…"


def view_table(title: str, messages: list[dict[str, Any]]) -> Table:
    """A numbered table of messages (role, one line of content) for the terminal."""
    table = Table(title=title, show_lines=False, title_justify="left")
    table.add_column("#", justify="right", style="dim")
    table.add_column("role", style="cyan")
    table.add_column("content")
    for i, m in enumerate(messages, 1):
        table.add_row(str(i), str(m.get("role")), escape(short(m)))
    return table
