"""mkdocs hook: the tables the docs generate from code and from benchmark results.

A page writes a marker on a line of its own and the build puts the table there, so the
docs cannot drift from what they describe:

- ``<!-- generated: config -->``: every ``ContextConfig`` key (nested ones dotted), its
  type and default, from the dataclasses in ``core/config.py``;
- ``<!-- generated: settings -->``: every service setting, its ``CONTEXTLEDGER_*``
  variable, default and help, from ``http/settings.Settings``;
- ``<!-- generated: turns -->`` / ``<!-- generated: conversations -->`` /
  ``<!-- generated: conversations-hybrid -->`` / ``<!-- generated: needles -->``: the
  figures of ``bench/results/turns.json`` / ``conversations.json`` /
  ``conversations-hybrid.json`` / ``recall.json``, with their date and commit.

A field's help is its metadata ``help``: config fields declare theirs once, with their
check (``core/config.py``'s ``setting``), as the service settings do.
``tests/unit/test_docs_tables.py`` checks the README's performance table is the one
``turns_table`` renders from the current results.
"""

from __future__ import annotations

import dataclasses
import json
import re
import types
import typing
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

# ruff: noqa: RUF001 (the tables print the multiplication sign for ratios, as the docs do)

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
MARKER = re.compile(r"^<!-- generated: ([a-z-]+) -->$", re.M)


def _type_name(tp: Any) -> str:
    """A field type as a reader writes it (``int | None``, ``'a' | 'b'``, ``list``)."""
    if isinstance(tp, str):
        return tp
    origin = typing.get_origin(tp)
    if origin is typing.Literal:
        return " | ".join(repr(a) for a in typing.get_args(tp))
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type_name(a) for a in typing.get_args(tp))
    if origin is not None:
        return getattr(origin, "__name__", str(origin))
    return "None" if tp is type(None) else getattr(tp, "__name__", str(tp))


def _default(f: dataclasses.Field[Any]) -> str:
    if f.default is not dataclasses.MISSING:
        value: Any = f.default
    elif f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
    else:
        return "(required)"
    if dataclasses.is_dataclass(value):
        return "(see below)"
    if isinstance(value, Mapping):
        value = dict(value)
    if isinstance(value, tuple):
        value = list(value)
    return f"`{json.dumps(value)}`"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _config_rows(cls: type, prefix: str = "") -> Iterator[tuple[str, str, str, str]]:
    hints = typing.get_type_hints(cls)
    nested = []
    for f in dataclasses.fields(cls):
        key = prefix + f.name
        if dataclasses.is_dataclass(hints[f.name]):
            nested.append((hints[f.name], key + "."))
            continue
        help_text = f.metadata.get("help", "")
        yield key, _type_name(hints[f.name]), _default(f), help_text
    for inner, inner_prefix in nested:
        yield from _config_rows(inner, inner_prefix)


def config_table() -> str:
    """Every session configuration key, from ``ContextConfig``'s fields."""
    from contextledger.core.config import ContextConfig

    rows = [
        f"| `{k}` | `{_cell(t)}` | {_cell(d)} | {_cell(h)} |"
        for k, t, d, h in _config_rows(ContextConfig)
    ]
    return "\n".join(["| key | type | default | what it does |", "|---|---|---|---|", *rows])


def settings_table() -> str:
    """Every service setting, from ``Settings``' fields and their ``help`` metadata."""
    from contextledger.http.settings import ENV_PREFIX, Settings

    hints = typing.get_type_hints(Settings)
    rows = []
    for f in dataclasses.fields(Settings):
        help_text = f.metadata.get("help") or {
            "dsn": "PostgreSQL DSN (none: the embedded server under `home`).",
            "home": "Where the embedded server keeps its data.",
            "log_format": "console | json (default: console on a terminal, JSON otherwise).",
        }.get(f.name, "")
        rows.append(
            f"| `{ENV_PREFIX}{f.name.upper()}` | `--{f.name.replace('_', '-')}` "
            f"| `{_cell(_type_name(hints[f.name]))}` | {_cell(_default(f))} "
            f"| {_cell(help_text)} |"
        )
    head = ["| variable | flag | type | default | what it does |", "|---|---|---|---|---|"]
    return "\n".join(head + rows)


def _results(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((RESULTS / f"{name}.json").read_text())
    return data


def turns_table() -> str:
    """``bench/turns.py``'s last run: ms per turn against the raw floor, dated."""
    data = _results("turns")
    lengths = [str(n) for n in data["lengths"]]
    floor = data["floor_ms"]
    head = "| ms per turn (× last-50 floor) | " + " | ".join(f"@{int(n):,}" for n in lengths)
    rows = [
        head + " |",
        "|---|" + "---:|" * len(lengths),
        "| raw floor (2 INSERTs + SELECT last 50) | "
        + " | ".join(f"{floor[n]:.2f}" for n in lengths)
        + " |",
    ]
    names = {"none": "no config, recall on", "none-recall-off": "recall off"}
    for store, runs in data["runs"].items():
        for run, figures in runs.items():
            cells = []
            for n in lengths:
                ms = figures["ms_median_p95"].get(n)
                cells.append(f"{ms[0]:.2f} ({ms[0] / floor[n]:.1f}×)" if ms else "")
            label = f"{'PostgreSQL' if store == 'pg' else store}, {names.get(run, run)}"
            rows.append(f"| {label} | " + " | ".join(cells) + " |")
    rows.append("")
    rows.append(
        f"`bench/turns.py`, {data['date']}, commit {data['commit']}, "
        f"{data.get('text', '')} text, embedded PostgreSQL 18, a 2-core machine."
    )
    return "\n".join(rows)


def conversations_table(name: str = "conversations") -> str:
    """``bench/conversations.py``'s last run: how often recall finds the evidence."""
    data = _results(name)
    rows = [
        f"| {data['conversations']} conversations | budget | any evidence | all | "
        "multi-hop all | ms a request |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in data["rows"]:
        store = "PostgreSQL" if r["store"] == "pg" else "`memory://`"
        rows.append(
            f"| {store}, recall {'on' if r['recall'] else 'off'} | {r['budget_pct']}% "
            f"| {r['any'] / r['asked']:.0%} | {r['all'] / r['asked']:.0%} "
            f"| {r['multi_hop_all'] / r['multi_hop']:.0%} | {r['ms_median']:.1f} |"
        )
    rows.append("")
    kinds = [
        f"{'PostgreSQL' if r['store'] == 'pg' else '`memory://`'} {r['budget_pct']}%: "
        + ", ".join(f"{k} {v:.0%}" for k, v in sorted(r["by_kind_any"].items()))
        for r in data["rows"]
        if r["recall"]
    ]
    rows.append("Any evidence by kind, recall on: " + "; ".join(kinds) + ".")
    rows.append("")
    rows.append(f"`bench/conversations.py`, {data['date']}, commit {data['commit']}.")
    return "\n".join(rows)


def needles_table() -> str:
    """``bench/recall.py``'s last run: planted facts found in the request, per strategy."""
    data = _results("recall")
    found: dict[tuple[int, str, str, bool], dict[str, Any]] = {
        (r["budget_pct"], r["config"], r["store"], r["recall"]): r for r in data["rows"]
    }
    stores = [s for s in ("memory", "postgres") if any(k[2] == s for k in found)]
    names = {"memory": "`memory://`", "postgres": "PostgreSQL"}
    rows: list[str] = []
    for pct in sorted({k[0] for k in found}):
        rows.append(
            f"| {pct}% budget | "
            + " | ".join(f"{names[s]} on | off | stale only" for s in stores)
            + " |"
        )
        rows.append("|---|" + "---:|---:|---:|" * len(stores))
        for config in dict.fromkeys(k[1] for k in found if k[0] == pct):
            cells = []
            for store in stores:
                on, off = (
                    found.get((pct, config, store, True)),
                    found.get((pct, config, store, False)),
                )
                cells.append(f"**{on['found']}/{on['asked']}**" if on else "(not run)")
                cells.append(f"{off['found']}/{off['asked']}" if off else "")
                cells.append(f"{on['stale_only']}/{on['changed']}" if on else "")
            rows.append(f"| {config} | " + " | ".join(cells) + " |")
        rows.append("")
    rows.append(
        f"`bench/recall.py`, {data['date']}, commit {data['commit']}: {data['turns']:,} turns, "
        f"{data['facts']} facts ({data['changed']} changed later), embedded PostgreSQL 18."
    )
    return "\n".join(rows)


GENERATORS: dict[str, Callable[[], str]] = {
    "config": config_table,
    "settings": settings_table,
    "turns": turns_table,
    "conversations": conversations_table,
    "conversations-hybrid": lambda: conversations_table("conversations-hybrid"),
    "needles": needles_table,
}


def render(markdown: str) -> str:
    """``markdown`` with every marker replaced by its table (an unknown one raises)."""

    def table(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in GENERATORS:
            raise ValueError(f"no generated table named {name!r}")
        return GENERATORS[name]()

    return MARKER.sub(table, markdown)


def on_page_markdown(markdown: str, **_: Any) -> str:
    """mkdocs' hook: runs on every page's markdown before it is rendered."""
    return render(markdown)
