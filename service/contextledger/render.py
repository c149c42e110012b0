"""Terminal rendering shared by the CLI and the demo (rich)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Collection, Sequence
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


def _shares(natural: list[int], room: int) -> list[int]:
    """Widths for columns whose natural widths exceed ``room``: the widest give way first
    (water-filling), none below 1, so narrow columns stay whole as long as possible."""
    widths = list(natural)
    while sum(widths) > room and max(widths) > 1:
        top = max(widths)
        lower = max((w for w in widths if w < top), default=1)
        tops = [i for i, w in enumerate(widths) if w == top]
        cut = min(top - lower, -(-(sum(widths) - room) // len(tops)))
        for i in tops:
            widths[i] = max(1, widths[i] - max(1, cut))
    return widths


def fitted_table(
    title: str,
    columns: Sequence[str],
    rows: Sequence[Sequence[str]],
    *,
    width: int,
    keep: Collection[str] = (),
    full: bool = False,
    styles: dict[str, str] | None = None,
) -> Table:
    """A one-line-per-row table that fits ``width`` columns of terminal: the ``keep``
    columns (seq, role, tokens: short and essential) stay whole; the others share what is
    left and end in an ellipsis. ``full`` folds long cells onto more lines instead.

    rich alone shrinks every no-wrap column evenly once a table is too wide, which is why
    a seq or a token count collapsed to ``…`` below ~160 columns."""
    table = Table(title=title, title_justify="left")
    natural = [
        max([len(name), *(len(str(row[i])) for row in rows)]) for i, name in enumerate(columns)
    ]
    chrome = 3 * len(columns) + 1  # a border and a space of padding either side
    kept = sum(n for name, n in zip(columns, natural, strict=True) if name in keep)
    flexible = [i for i, name in enumerate(columns) if name not in keep]
    room = max(len(flexible), width - chrome - kept)
    shares = dict(zip(flexible, _shares([natural[i] for i in flexible], room), strict=True))
    for i, name in enumerate(columns):
        style = (styles or {}).get(name, "")
        if name in keep:
            table.add_column(name, no_wrap=True, min_width=natural[i], style=style)
        elif full:
            table.add_column(name, overflow="fold", style=style)
        else:
            table.add_column(
                name, no_wrap=True, overflow="ellipsis", max_width=shares[i], style=style
            )
    for row in rows:
        table.add_row(*(escape(str(cell)) for cell in row))
    return table


def view_table(title: str, messages: list[dict[str, Any]], *, width: int | None = None) -> Table:
    """A numbered table of messages (role, one line of content) for the terminal
    (``width``: the terminal's, by default)."""
    if width is None:
        width = shutil.get_terminal_size().columns
    rows = [(str(i), str(m.get("role")), short(m, 10_000)) for i, m in enumerate(messages, 1)]
    table = fitted_table(
        title,
        ("#", "role", "content"),
        rows,
        width=width,
        keep=("#", "role"),
        styles={"#": "dim", "role": "cyan"},
    )
    table.columns[0].justify = "right"
    return table
