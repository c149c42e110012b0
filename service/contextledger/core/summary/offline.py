"""The extractive offline summarizer: used when no model gives a valid summary.

Deterministic: the same messages and prior summary give the same text.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from contextledger.core.messages import own_text
from contextledger.core.summary.prompt import SECTION_TITLES, render_message
from contextledger.core.tokens import CharsCounter, TokenCounter

OFFLINE_VERSION = "cl-offline-v1"
#: ``model`` of summaries written by :func:`offline_summary`.
OFFLINE_MODEL = "offline"


# ==================================================================== offline summary

_SENTENCE_SPLIT_RE = re.compile(r"(?<=[.!?])\s+|\n+")
_STRONG_FACT_RE = re.compile(
    r"\b(?:my|our)\s+(?:[\w'\u2019-]+\s+){0,3}(?:is|are|was)\b"
    r"|\bi\s+am\b|\bi['\u2019]m\b|\bcall\s+me\b"
    r"|\bi\s+(?:prefer|like|want|use|need)\b|\bplease\s+(?:always|never)\b|\balways\b|\bnever\b"
    r"|\bremember\b|\b(?:is|are|=|:)\s*\d",
    re.IGNORECASE,
)
#: A value worth keeping: a number of 3+ digits or with separators (ports, amounts,
#: dates, versions), a URL, an e-mail, an identifier. "step 4" is chatter, not a fact.
_WEAK_FACT_RE = re.compile(
    r"\d{3,}|\d[.,:/-]\d|https?://|[\w.+-]+@[\w-]+\.[\w.]+|\b[A-Z][a-z]+[A-Z]\w*"
    r"|\b\w+_\w+\b|\b[A-Z]{2,}\b"
)
_DECISION_RE = re.compile(
    r"\b(?:decided|decision|we['\u2019]ll|we\s+will|let['\u2019]s|let\s+us|going\s+with|go\s+with"
    r"|agreed|chose|choose|settled\s+on|instead\s+of|switch(?:ed)?\s+to|use\s+\S+)",
    re.IGNORECASE,
)
_ERROR_RE = re.compile(
    r"\b(?:error|exception|traceback|failed|fails|failing|failure|crash(?:ed)?|bug"
    r"|fixed|resolved|broken)\b|\b\w+Error\b",
    re.IGNORECASE,
)
_PATH_RE = re.compile(
    r"(?<![\w/.-])(?:\.{0,2}/)?(?:[\w.-]+/)*[\w-]+\.(?:py|pyi|ts|tsx|js|jsx|go|rs|java|kt|rb"
    r"|c|h|cc|cpp|hpp|cs|php|sh|sql|md|rst|txt|toml|yaml|yml|json|ini|cfg|conf|html|css"
    r"|lock|env|xml|proto|tf|ipynb)\b(?![\w/])"
    r"|(?<![\w])/(?:[\w.-]+/)+[\w.-]+"
)
_HEADING_RE = re.compile(
    r"^\s*#{1,6}\s*(.+?)\s*:?\s*$|^\s*\*\*(.+?)\*\*\s*:?\s*$|^\s*([A-Z][\w ]+):\s*$"
)

_MAX_LINE = 300
#: Line priorities (higher survives trimming; among equals the newest survives).
NEW_STRONG = 100  # a user fact with a strong cue ("my name is", "the port is 8443")
CARRIED_STRONG = 98  # the same, carried from the prior summary
NEW = 88  # a user line with a number or an identifier
ASSISTANT_STRONG = 97
ASSISTANT = 87
CARRIED = 84
TOOL = 83  # tool-call arguments, small JSON results


@dataclass(slots=True)
class _Line:
    section: str
    text: str
    priority: int
    order: int


def _sentences(text: str) -> list[str]:
    return [s.strip() for s in _SENTENCE_SPLIT_RE.split(text) if s and s.strip()]


def _clip(sentence: str, match: re.Match[str] | None = None) -> str:
    """At most ``_MAX_LINE`` chars, keeping the part around ``match`` (the fact)."""
    if len(sentence) <= _MAX_LINE:
        return sentence
    start = 0 if match is None else max(0, match.start() - _MAX_LINE // 3)
    return (
        "…" + sentence[start : start + _MAX_LINE].strip() + "…"
        if start
        else (sentence[:_MAX_LINE].strip() + "…")
    )


def parse_sections(summary: str) -> dict[str, list[str]]:
    """Split a sectioned summary into ``{title: [lines]}``; text before any heading → ``""``."""
    sections: dict[str, list[str]] = {"": []}
    current = ""
    for raw in summary.splitlines():
        match = _HEADING_RE.match(raw)
        if match:
            current = next(g for g in match.groups() if g).strip()
            sections.setdefault(current, [])
            continue
        if raw.strip():
            sections[current].append(raw.rstrip())
    return sections


def _canonical_section(title: str) -> str | None:
    low = title.lower()
    for known in SECTION_TITLES:
        if known.lower() in low or low in known.lower():
            return known
    return None


def offline_summary(
    messages: Sequence[Mapping[str, Any]],
    prior_summary: str | None = None,
    *,
    max_tokens: int = 1024,
    counter: TokenCounter | None = None,
) -> str:
    """An extractive summary in the same sections as the model's, with no model.

    Used when every model fails, so compaction still frees space. Keeps the first
    request, user statements carrying names/numbers/identifiers (verbatim),
    decisions, files, errors and the last state; carries the prior summary's
    durable facts verbatim. Over budget, the lowest-value (then oldest) lines go
    first. Deterministic.
    """
    counter = counter or CharsCounter()
    lines: list[_Line] = []
    order = 0

    def add(section: str, text: str, priority: int) -> None:
        nonlocal order
        text = text.strip()
        if text:
            lines.append(_Line(section, text, priority, order))
            order += 1

    # Priorities: see NEW_STRONG ... TOOL; then first request 96, last request 94,
    # current state 90, prior overview 80, decisions 60, files 55, errors 45. Facts
    # first: they are what must survive verbatim; new ones before carried ones.
    if prior_summary and prior_summary.strip():
        prior_priority = {
            "Durable facts": 100,
            "Task overview": 80,
            "Pending items": 50,
            "Decisions made": 50,
            "Current state": 35,
        }
        for title, body in parse_sections(prior_summary).items():
            known = _canonical_section(title) if title else None
            for raw in body:
                if known is None:
                    add(
                        "Task overview",
                        raw if raw.lstrip().startswith(("-", "*")) else f"- {raw}",
                        40,
                    )
                elif known == "Durable facts":
                    # a carried fact keeps its strength but ranks below a new one of
                    # the same strength: carried lines never crowd out new facts
                    add(known, raw, CARRIED_STRONG if _STRONG_FACT_RE.search(raw) else CARRIED)
                else:
                    add(known, raw, prior_priority.get(known, 30))

    # (role, everything rendered, only what the author wrote: no tool calls or results)
    rendered = [
        (str(m.get("role", "")), render_message(m, max_block_chars=2000), own_text(m))
        for m in messages
    ]
    first_user = next((own for role, _, own in rendered if role == "user" and own.strip()), None)
    if first_user and not (prior_summary and prior_summary.strip()):  # else the prior has it
        add("Task overview", f"- First request: {_clip(' '.join(first_user.split()))}", 96)

    seen_paths: set[str] = set()
    for message, (role, text, own) in zip(messages, rendered, strict=True):
        if role in ("user", "assistant"):  # a fact the assistant states is a fact too
            for sentence in _sentences(own):
                strong = _STRONG_FACT_RE.search(sentence)
                weak = None if strong else _WEAK_FACT_RE.search(sentence)
                if strong or weak:
                    if role == "user":
                        priority = NEW_STRONG if strong else NEW
                    else:
                        priority = ASSISTANT_STRONG if strong else ASSISTANT
                    add("Durable facts", f"- {_clip(sentence, strong or weak)}", priority)
        for fact in _tool_facts(message):
            add("Durable facts", f"- {fact}", TOOL)
        for sentence in _sentences(text):
            decision = _DECISION_RE.search(sentence)
            if decision:
                add("Decisions made", f"- {_clip(sentence, decision)}", 60)
            error = _ERROR_RE.search(sentence)
            if error:
                add("Errors and resolutions", f"- {_clip(sentence, error)}", 45)
        for match in _PATH_RE.finditer(text):
            path = match.group(0)
            if path not in seen_paths:
                seen_paths.add(path)
                add("Files and code changed", f"- `{path}`", 55)

    last_assistant = next(
        (own for role, _, own in reversed(rendered) if role == "assistant" and own.strip()), None
    )
    if last_assistant:
        add("Current state", f"- {_clip(' '.join(last_assistant.split()))}", 90)
    if rendered and rendered[-1][0] == "user" and rendered[-1][2].strip():
        add("Pending items", f"- Last request: {_clip(' '.join(rendered[-1][2].split()))}", 94)

    # Drop duplicate lines within a section (first occurrence wins), and a fact a later
    # line restates with another value (the newest value wins).
    unique: list[_Line] = []
    seen: set[tuple[str, str]] = set()
    for line in lines:
        key = (line.section, line.text)
        if key not in seen:
            seen.add(key)
            unique.append(line)
    return _fit(_drop_superseded(unique), max_tokens, counter)


_VALUE_RE = re.compile(r"\S*\d\S*|\S+@\S+|\S*[/_]\S*")
_SUBJECT_WORD_RE = re.compile(r"[a-z][a-z'-]+")


def _subject(text: str) -> tuple[frozenset[str], bool]:
    """The words of a fact line without its values, and whether it holds a value."""
    values = _VALUE_RE.findall(text)
    rest = _VALUE_RE.sub(" ", text.lower())
    return frozenset(_SUBJECT_WORD_RE.findall(rest)), bool(values)


def _drop_superseded(lines: list[_Line]) -> list[_Line]:
    """Durable facts: an older line whose subject a newer line restates with a different
    value goes ("orchard-api binds to 18443" then "... binds to 20001")."""
    latest: dict[frozenset[str], int] = {}
    for line in lines:
        if line.section == "Durable facts":
            words, has_value = _subject(line.text)
            if has_value and len(words) >= 2:
                latest[words] = line.order
    out: list[_Line] = []
    for line in lines:
        if line.section == "Durable facts":
            words, has_value = _subject(line.text)
            if has_value and len(words) >= 2 and latest[words] != line.order:
                continue
        out.append(line)
    return out


def _tool_facts(message: Mapping[str, Any]) -> list[str]:
    """Short facts inside tool traffic: a call's arguments, a small JSON object result."""
    out: list[str] = []
    calls = message.get("tool_calls")
    if isinstance(calls, list):
        for call in calls:
            fn = call.get("function") if isinstance(call, Mapping) else None
            if isinstance(fn, Mapping) and isinstance(fn.get("arguments"), str):
                args = " ".join(fn["arguments"].split())
                if _WEAK_FACT_RE.search(args) and len(args) <= _MAX_LINE:
                    out.append(f"{fn.get('name', 'tool')}({args})")
    if str(message.get("role", "")) == "tool" and isinstance(message.get("content"), str):
        text = message["content"].strip()
        if text.startswith("{") and len(text) <= _MAX_LINE:
            try:
                value = json.loads(text)
            except ValueError:
                value = None
            if isinstance(value, dict) and _WEAK_FACT_RE.search(text):
                out.append(f"result: {' '.join(text.split())}")
    return out


_OFFLINE_HEADER = "_Extractive summary (no model was available)._"


def _render_lines(lines: Sequence[_Line]) -> str:
    if not lines:
        return ""
    parts = [_OFFLINE_HEADER]
    for title in SECTION_TITLES:
        body = [line.text for line in lines if line.section == title]
        if body:
            parts.append(f"## {title}")
            parts.extend(body)
    return "\n".join(parts)


def _fit(lines: list[_Line], max_tokens: int, counter: TokenCounter) -> str:
    """Drop lowest-priority (then oldest) lines until the text fits ``max_tokens``."""
    if max_tokens <= 0:
        return ""
    drop_order = sorted(lines, key=lambda ln: (ln.priority, ln.order))
    kept = list(lines)
    # Estimate first (cheap per-line counts), then confirm with the real count.
    budget = max_tokens
    estimate = sum(counter.count_text(ln.text) + 1 for ln in kept) + 8 * len(SECTION_TITLES)
    dropped: set[int] = set()
    for ln in drop_order:
        if estimate <= budget:
            break
        estimate -= counter.count_text(ln.text) + 1
        dropped.add(ln.order)
    kept = [ln for ln in kept if ln.order not in dropped]
    text = _render_lines(kept)
    remaining = [ln for ln in drop_order if ln.order not in dropped]
    while text and counter.count_text(text) > max_tokens and remaining:
        victim = remaining.pop(0)
        kept = [ln for ln in kept if ln.order != victim.order]
        text = _render_lines(kept)
    # Re-add the most valuable (then newest) dropped lines that still fit: the estimate
    # may have been pessimistic.
    for ln in sorted(
        (ln for ln in lines if ln.order in dropped), key=lambda ln: (-ln.priority, -ln.order)
    ):
        trial = sorted([*kept, ln], key=lambda x: x.order)
        trial_text = _render_lines(trial)
        if counter.count_text(trial_text) <= max_tokens:
            kept, text = trial, trial_text
    if counter.count_text(text) > max_tokens:  # even the header does not fit
        lo, hi = 0, len(text)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if counter.count_text(text[:mid]) <= max_tokens:
                lo = mid
            else:
                hi = mid - 1
        text = text[:lo].rstrip()
    return text
