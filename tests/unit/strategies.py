"""Hypothesis strategies (and plain builders) for conversations in both provider shapes.

``conversations()`` draws whole views - system prompts, human turns, long and
short assistant replies, tool batches of 1-6 calls whose results may be
shuffled, spread over several messages, missing, identical in text, huge, or
displaced; orphan results, summaries, critical items, a work-in-progress call at
the tail - as ``tuple[ViewItem, ...]`` with tokens counted by ``COUNTER``.
``configs()`` draws compaction configs. The builders (``user``, ``openai_call``,
``items`` ...) make named regression cases readable.
"""

from __future__ import annotations

import functools
import math
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from hypothesis import strategies as st

from contextledger.core.config import ContextConfig
from contextledger.core.tokens import CharsCounter
from contextledger.core.view import ORD_STRIDE, ItemKind, ViewItem

COUNTER = CharsCounter()
Shape = Literal["openai", "anthropic"]

WORDS = (
    "the", "build", "fails", "in", "config.py", "parse_args", "line", "42", "retry",
    "src/app/main.py", "userId", "ok", "please", "check", "test_units", "1024", "error",
    "migration", "table", "events", "README.md", "value", "and", "then", "fix", "it",
)  # fmt: skip
TOOL_NAMES = ("read_file", "grep", "run", "skill", "memory_search")


# --------------------------------------------------------------------------- builders


def system(text: str) -> dict[str, Any]:
    return {"role": "system", "content": text}


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def assistant(text: str) -> dict[str, Any]:
    return {"role": "assistant", "content": text}


def openai_call(calls: Sequence[tuple[str, str]], text: str | None = None) -> dict[str, Any]:
    """Assistant message with OpenAI ``tool_calls``; ``calls`` are ``(id, tool name)``."""
    return {
        "role": "assistant",
        "content": text,
        "tool_calls": [
            {"id": cid, "type": "function", "function": {"name": name, "arguments": "{}"}}
            for cid, name in calls
        ],
    }


def openai_result(call_id: str, content: Any, name: str | None = None) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "tool", "tool_call_id": call_id, "content": content}
    if name is not None:
        message["name"] = name
    return message


def anthropic_call(calls: Sequence[tuple[str, str]], text: str | None = None) -> dict[str, Any]:
    blocks: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
    blocks += [{"type": "tool_use", "id": cid, "name": name, "input": {}} for cid, name in calls]
    return {"role": "assistant", "content": blocks}


def anthropic_results(
    results: Sequence[tuple[str, Any]], text: str | None = None
) -> dict[str, Any]:
    blocks: list[dict[str, Any]] = [
        {"type": "tool_result", "tool_use_id": cid, "content": content} for cid, content in results
    ]
    if text:
        blocks.append({"type": "text", "text": text})
    return {"role": "user", "content": blocks}


@dataclass(frozen=True)
class Spec:
    """A message plus how it sits in the view (for ``items``)."""

    message: Mapping[str, Any]
    critical: bool = False
    kind: ItemKind = "message"


def items(
    messages: Iterable[Mapping[str, Any] | Spec], *, first_seq: int = 1
) -> tuple[ViewItem, ...]:
    """ViewItems with seq ``first_seq, first_seq+1, ...`` and tokens by ``COUNTER``."""
    out: list[ViewItem] = []
    for offset, entry in enumerate(messages):
        spec = entry if isinstance(entry, Spec) else Spec(entry)
        seq = first_seq + offset
        out.append(
            ViewItem(
                ref=(seq, 0),
                ord=seq * ORD_STRIDE,
                message=spec.message,
                tokens=COUNTER.count_message(spec.message),
                critical=spec.critical,
                kind=spec.kind,
            )
        )
    return tuple(out)


def call_batch(
    shape: Shape, calls: Sequence[tuple[str, str]], results: Sequence[tuple[str, Any]]
) -> list[dict[str, Any]]:
    """A call message followed by its results (one message per result)."""
    if shape == "openai":
        return [openai_call(calls), *(openai_result(cid, c) for cid, c in results)]
    return [anthropic_call(calls), *(anthropic_results([r]) for r in results)]


# --------------------------------------------------------------------------- strategies


# Strategies are built once, here, not inside the composites: a strategy made afresh at
# every draw is validated afresh too, which cost the property tests as much as drawing.
_BOOL = st.booleans()
_SEED = st.integers(0, 2**32 - 1)


@functools.cache
def texts(*, min_words: int = 1, max_words: int = 30) -> st.SearchStrategy[str]:
    """Words of :data:`WORDS`, as many as ``st.lists`` would draw on average.

    Two draws a text (a length, a seed for the words) rather than two a word: drawing
    the words one by one was most of what generating a conversation cost, and no test
    here cares which word stands where, only how long a text is and that texts repeat.
    Both shrink: to the shortest text, then to seed 0's words.
    """
    return st.builds(_words, _length(min_words, max_words), _SEED)


def _words(count: int, seed: int) -> str:
    return " ".join(random.Random(seed).choices(WORDS, k=count))


def _length(low: int, high: int) -> st.SearchStrategy[int]:
    """``low`` plus a geometric number of extra words, capped at ``high``, with the
    average hypothesis's ``st.lists`` uses (``min(max(2 low, low + 5), (low + high) / 2)``).
    """
    average = min(max(2 * low, low + 5), (low + high) / 2)
    more = 1 - 1 / (1 + average - low)  # the chance of one more word

    def pick(x: int) -> int:
        if more <= 0:
            return low
        return min(high, low + int(math.log1p(-x / 2**16) / math.log(more)))

    return st.integers(0, 2**16 - 1).map(pick)


_SIZE = st.sampled_from(("small", "small", "same", "large", "huge"))
_LARGE_REPEATS = st.integers(20, 80)
_HUGE_LINES = st.integers(110, 160)


@st.composite
def _tool_output(draw: st.DrawFn) -> Any:
    size = draw(_SIZE)
    if size == "same":
        return "identical output"
    text = draw(texts())
    if size == "large":
        text = (text + "\n") * draw(_LARGE_REPEATS)
    elif size == "huge":
        text = ("x" * 99 + "\n") * draw(_HUGE_LINES)  # > 10,000 chars
    if draw(_BOOL):
        return text
    return [{"type": "text", "text": text}]


_TOOL_OUTPUT = _tool_output()
_SHAPE = st.sampled_from(("openai", "anthropic"))
_SYSTEMS = st.integers(0, 2)
_SEGMENT = st.sampled_from(
    (
        "human", "human", "reply", "reply", "ack", "tools", "tools", "tools",
        "orphan", "displaced", "summary", "system", "duplicate",
    )
)  # fmt: skip
_ONE_IN_20 = st.integers(0, 19)
_ACK = st.sampled_from(("ok", "Done.", "Sure, on it."))
_BATCH = st.integers(1, 6)
_TOOL_NAME = st.sampled_from(TOOL_NAMES)
_ONE_IN_10 = st.integers(0, 9)
_ONE_IN_5 = st.integers(0, 4)
_CALL_TEXT = st.one_of(st.none(), texts())


@functools.cache
def _segments(min_size: int, max_size: int) -> st.SearchStrategy[list[str]]:
    return st.lists(_SEGMENT, min_size=min_size, max_size=max_size)


@st.composite
def conversations(
    draw: st.DrawFn,
    shape: Shape | None = None,
    *,
    min_segments: int = 1,
    max_segments: int = 30,
    orphans: bool = True,
    critical: bool = True,
    open_tail: bool = True,
) -> tuple[ViewItem, ...]:
    """A random view in one provider shape (see the module docstring)."""
    kind_of_shape: Shape = shape if shape is not None else draw(_SHAPE)
    specs: list[Spec] = []
    ids = iter(range(10**9))

    def add(message: Mapping[str, Any], *, crit: bool = False, kind: ItemKind = "message") -> None:
        specs.append(Spec(message, crit, kind))

    for _ in range(draw(_SYSTEMS)):
        add(system(draw(texts(min_words=3, max_words=40))))
    segments = draw(_segments(min_segments, max_segments))
    for segment in segments:
        crit = critical and draw(_ONE_IN_20) == 0
        if segment == "human":
            add(user(draw(texts())), crit=crit)
        elif segment == "reply":
            add(assistant(draw(texts(min_words=20, max_words=80))), crit=crit)
        elif segment == "ack":
            add(assistant(draw(_ACK)))
        elif segment == "duplicate":
            plain = [s for s in specs if isinstance(s.message.get("content"), str)]
            plain = [s for s in plain if s.message.get("role") in ("user", "assistant")]
            if plain:
                add(dict(draw(st.sampled_from(plain)).message))
        elif segment == "summary":
            add(user("Summary of earlier turns: " + draw(texts())), kind="summary")
        elif segment == "system":
            add(system(draw(texts(min_words=2))))
        elif segment == "orphan":
            ghost = f"ghost_{next(ids)}"
            if kind_of_shape == "openai":
                add(openai_result(ghost, draw(texts())))
            else:
                add(anthropic_results([(ghost, draw(texts()))]))
        else:  # tools / displaced
            n = draw(_BATCH)
            calls = [(f"call_{next(ids)}", draw(_TOOL_NAME)) for _ in range(n)]
            answered = [c for c in calls if draw(_ONE_IN_10) > 0]
            answered = draw(st.permutations(answered))
            results = [(cid, draw(_TOOL_OUTPUT)) for cid, _ in answered]
            crit_unit = crit and segment == "tools"
            if kind_of_shape == "openai":
                add(openai_call(calls, draw(_CALL_TEXT)), crit=crit_unit)
                chunks: list[list[tuple[str, Any]]] = [[r] for r in results]
            else:
                add(anthropic_call(calls, draw(_CALL_TEXT)), crit=crit_unit)
                chunks = []
                rest = list(results)
                while rest:
                    take = draw(st.integers(1, len(rest)))
                    chunks.append(rest[:take])
                    rest = rest[take:]
            displaced: list[tuple[str, Any]] = []
            if segment == "displaced" and chunks:
                displaced = chunks.pop()
            for chunk in chunks:
                if kind_of_shape == "openai":
                    add(openai_result(*chunk[0]))
                else:
                    add(anthropic_results(chunk))
            if displaced:
                add(user(draw(texts())))
                if kind_of_shape == "openai":
                    add(openai_result(*displaced[0]))
                else:
                    add(anthropic_results(displaced))
    if not orphans:
        specs = [s for s in specs if not _is_orphan_spec(s)]
    if open_tail and draw(_ONE_IN_5) == 0:
        cid = f"call_{next(ids)}"
        if kind_of_shape == "openai":
            add(openai_call([(cid, "run")]))
        else:
            add(anthropic_call([(cid, "run")]))
    return items(specs)


def _is_orphan_spec(spec: Spec) -> bool:
    message = spec.message
    if message.get("role") == "tool":
        return str(message.get("tool_call_id", "")).startswith("ghost_")
    content = message.get("content")
    return isinstance(content, list) and any(
        isinstance(b, Mapping) and str(b.get("tool_use_id", "")).startswith("ghost_")
        for b in content
    )


@st.composite
def configs(draw: st.DrawFn) -> ContextConfig:
    """Compaction settings worth varying; the rest stay at their defaults."""
    return ContextConfig.from_mapping(
        {
            "keep_recent": draw(st.integers(1, 12)),
            "preserve_system": draw(st.sampled_from((True, True, True, False))),
            "max_tool_output_chars": draw(st.sampled_from((100, 500, 2000, 10_000))),
            "protect_recent_tool_results": draw(st.integers(0, 4)),
            "min_score": draw(st.sampled_from((0.0, 0.3, 0.7))),
            "protected_tools": draw(st.sampled_from((["skill", "memory_search"], [], ["grep"]))),
        }
    )


STRATEGY_NAMES = ("truncate", "priority", "importance", "summarize")
