"""Atomic units of a view, and the repair that makes a view acceptable to a provider.

A provider rejects a request where a tool call is not answered or a tool result
has no call, so compaction keeps or drops *units* whole: an assistant message
with tool calls (OpenAI ``tool_calls`` or Anthropic ``tool_use`` blocks, any
number of them) together with the result messages that answer it (OpenAI
``role: "tool"`` messages, Anthropic user messages of ``tool_result`` blocks).
Every other message is a unit of its own.

Decision - results must *directly* follow their call. A unit is the call plus the
unbroken run of result messages after it whose ids all answer a still-open call
of that unit. Anything else ends the unit: another message of any role (system
included), a result for some other id, or a second result for an id already
answered. A result that arrives after such a break is an *orphan*: ``repair``
leaves it out rather than moving it, because reordering would change what the
model saw when it wrote the following turns. Two results with different ids are
never merged or deduplicated.

Decision - the tail: an unanswered call with nothing after it is work in
progress (the tool is running) and is left as is. An unanswered call followed by
anything else gets a synthetic error result right after its existing results.
``tail_start`` lets a caller mark a later suffix (e.g. messages it appends just
for one request) as part of the work in progress too.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from contextledger.core.tokens import CharsCounter, TokenCounter
from contextledger.core.view import Ref, ViewItem

#: Content of a synthetic result; providers need *some* answer for every call.
NO_RESULT_TEXT = "[no result: call was not answered]"

#: Parts of synthetic refs are negative: ``-(1 + call_part * SYNTHETIC_PART_STRIDE + k)``
#: for the k-th synthetic message answering the call item ``(seq, call_part)``.
SYNTHETIC_PART_STRIDE = 1024


# --------------------------------------------------------------------------- shapes


def tool_calls(message: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    """``(id, tool name)`` of every call in an assistant message, in order (both shapes)."""
    if message.get("role") != "assistant":
        return ()
    calls = message.get("tool_calls")
    content = message.get("content")
    if calls is None and (content is None or type(content) is str):  # plain prose, fast
        return ()
    out: list[tuple[str, str]] = []
    if isinstance(calls, Sequence) and not isinstance(calls, str):
        for call in calls:
            if isinstance(call, Mapping) and isinstance(call.get("id"), str):
                function = call.get("function")
                name = function.get("name") if isinstance(function, Mapping) else call.get("name")
                out.append((call["id"], name if isinstance(name, str) else ""))
    if isinstance(content, Sequence) and not isinstance(content, str):
        for block in content:
            if (
                isinstance(block, Mapping)
                and block.get("type") == "tool_use"
                and isinstance(block.get("id"), str)
            ):
                name = block.get("name")
                out.append((block["id"], name if isinstance(name, str) else ""))
    return tuple(out)


def call_ids(message: Mapping[str, Any]) -> tuple[str, ...]:
    return tuple(call_id for call_id, _ in tool_calls(message))


def result_ids(message: Mapping[str, Any]) -> tuple[str, ...]:
    """Ids answered by a result message (``""`` for a result that names no id)."""
    role = message.get("role")
    if role == "tool":
        call_id = message.get("tool_call_id")
        return (call_id if isinstance(call_id, str) else "",)
    if role != "user":
        return ()
    content = message.get("content")
    if content is None or type(content) is str:  # the usual turn, before the ABC checks
        return ()
    if not isinstance(content, Sequence) or isinstance(content, str):
        return ()
    ids: list[str] = []
    for block in content:
        if isinstance(block, Mapping) and block.get("type") == "tool_result":
            use_id = block.get("tool_use_id")
            ids.append(use_id if isinstance(use_id, str) else "")
    return tuple(ids)


def is_tool_message(message: Mapping[str, Any]) -> bool:
    """True for a message that calls tools or carries tool results."""
    return bool(result_ids(message)) or bool(tool_calls(message))


def is_human_turn(message: Mapping[str, Any]) -> bool:
    """A user message that is not (only) tool results: what a person actually said."""
    if message.get("role") != "user":
        return False
    content = message.get("content")
    if isinstance(content, Sequence) and not isinstance(content, str):
        return (
            any(not (isinstance(b, Mapping) and b.get("type") == "tool_result") for b in content)
            or not content
        )
    return True


# --------------------------------------------------------------------------- units


@dataclass(frozen=True, slots=True)
class Unit:
    """Positions ``[start, stop)`` of a sequence that are kept or dropped together."""

    start: int
    stop: int
    call_ids: tuple[str, ...] = ()
    #: calls of this unit that no result in it answers
    missing: tuple[str, ...] = ()
    #: a result message whose call is not right before it
    orphan: bool = False
    #: True when something follows the unit (so a missing result is not "in progress")
    closed: bool = False

    @property
    def is_tool(self) -> bool:
        return bool(self.call_ids) or self.orphan

    def __len__(self) -> int:
        return self.stop - self.start


def _group(messages: Sequence[Mapping[str, Any]]) -> list[Unit]:
    units: list[Unit] = []
    n = len(messages)
    i = 0
    while i < n:
        calls = call_ids(messages[i])
        if calls:
            pending = set(calls)
            j = i + 1
            while j < n:
                answered = result_ids(messages[j])
                if not answered or len(set(answered)) != len(answered):
                    break
                if not pending.issuperset(answered):
                    break
                pending.difference_update(answered)
                j += 1
            missing = tuple(dict.fromkeys(c for c in calls if c in pending))
            units.append(Unit(i, j, calls, missing, orphan=False, closed=j < n))
            i = j
        elif result_ids(messages[i]):
            units.append(Unit(i, i + 1, orphan=True, closed=i + 1 < n))
            i += 1
        else:
            units.append(Unit(i, i + 1, closed=i + 1 < n))
            i += 1
    return units


def group_units(items: Sequence[ViewItem]) -> tuple[Unit, ...]:
    """Split items into consecutive units covering every position once, in order. O(n)."""
    return tuple(_group([item.message for item in items]))


def unit_index(units: Sequence[Unit], size: int) -> list[int]:
    """Position -> index of the unit holding it."""
    owner = [0] * size
    for k, unit in enumerate(units):
        for pos in range(unit.start, unit.stop):
            owner[pos] = k
    return owner


# --------------------------------------------------------------------------- repair


@dataclass(frozen=True, slots=True)
class RepairResult:
    """A provider-valid view, the synthetic results it needed and the refs it left out."""

    items: tuple[ViewItem, ...]
    synthetic: tuple[ViewItem, ...]
    left_out: tuple[Ref, ...]

    @property
    def changed(self) -> bool:
        return bool(self.synthetic or self.left_out)


def synthetic_results(
    call: ViewItem, after: ViewItem, missing: Sequence[str], counter: TokenCounter
) -> tuple[ViewItem, ...]:
    """Error results for ``missing`` calls of ``call``, to be placed after ``after``.

    The shape follows the call: one ``role: "tool"`` message per OpenAI call, one
    user message of ``tool_result`` blocks (``is_error``) for Anthropic calls.
    Refs and ords are derived from the call, so repairing the same view twice gives
    the same items - the session records them once and never re-derives them.
    """
    names = dict(tool_calls(call.message))
    openai_ids: list[str] = []
    anthropic_ids: list[str] = []
    raw_calls = call.message.get("tool_calls")
    openai_all = {
        c.get("id")
        for c in (raw_calls if isinstance(raw_calls, Sequence) else ())
        if isinstance(c, Mapping)
    }
    for call_id in missing:
        (openai_ids if call_id in openai_all else anthropic_ids).append(call_id)
    messages: list[tuple[dict[str, Any], tuple[str, ...]]] = []
    for call_id in openai_ids:
        message: dict[str, Any] = {
            "role": "tool",
            "tool_call_id": call_id,
            "content": NO_RESULT_TEXT,
        }
        if names.get(call_id):
            message["name"] = names[call_id]
        messages.append((message, (call_id,)))
    if anthropic_ids:
        blocks = [
            {
                "type": "tool_result",
                "tool_use_id": call_id,
                "content": NO_RESULT_TEXT,
                "is_error": True,
            }
            for call_id in anthropic_ids
        ]
        messages.append(({"role": "user", "content": blocks}, tuple(anthropic_ids)))
    seq, part = call.ref
    out: list[ViewItem] = []
    for k, (message, ids) in enumerate(messages):
        out.append(
            ViewItem(
                ref=(seq, -(1 + part * SYNTHETIC_PART_STRIDE + k)),
                ord=after.ord + 1 + k,
                message=message,
                tokens=counter.count_message(message),
                critical=False,
                kind="synthetic",
                meta={
                    "synthetic_for": list(ids),
                    "reason": "unanswered_call",
                    "call_ref": list(call.ref),
                },
            )
        )
    return tuple(out)


def repair(
    items: Sequence[ViewItem],
    *,
    tail_start: int | None = None,
    counter: TokenCounter | None = None,
) -> RepairResult:
    """Make ``items`` provider-valid without touching the messages that stay.

    Orphan results are left out (their refs are returned); an unanswered call that
    is followed by anything gets synthetic results right after its existing ones,
    unless it starts at or after ``tail_start`` (an index into ``items``: work in
    progress). ``counter`` counts the synthetic messages (default ``CharsCounter``).
    O(n).
    """
    count = counter or CharsCounter()
    units = group_units(items)
    out: list[ViewItem] = []
    synthetic: list[ViewItem] = []
    left_out: list[Ref] = []
    limit = len(items) if tail_start is None else tail_start
    for unit in units:
        if unit.orphan:
            left_out.append(items[unit.start].ref)
            continue
        out.extend(items[unit.start : unit.stop])
        if unit.missing and unit.closed and unit.start < limit:
            made = synthetic_results(items[unit.start], items[unit.stop - 1], unit.missing, count)
            out.extend(made)
            synthetic.extend(made)
    if not synthetic and not left_out:
        return RepairResult(tuple(items), (), ())
    return RepairResult(tuple(out), tuple(synthetic), tuple(left_out))


def provider_valid(messages: Iterable[Mapping[str, Any]]) -> list[str]:
    """Violations a provider would reject (empty list = valid).

    Every result must answer a call of the assistant message right before its run
    of results, once; every call must be answered before any other message, except
    calls still open at the very end (work in progress).
    """
    violations: list[str] = []
    pending: dict[str, None] = {}
    opened_at = -1
    for i, message in enumerate(messages):
        content = message.get("content")
        if (
            (content is None or type(content) is str)
            and message.get("role") != "tool"
            and message.get("tool_calls") is None
        ):  # prose (most messages): neither results nor calls, so it closes any open call
            if pending:
                violations.append(
                    f"message {opened_at}: calls {list(pending)} not answered before message {i}"
                )
                pending = {}
            opened_at = i
            continue
        answered = result_ids(message)
        if answered:
            for call_id in answered:
                if call_id in pending:
                    del pending[call_id]
                else:
                    violations.append(
                        f"message {i}: result for {call_id!r} does not answer an open call "
                        "right before it"
                    )
            continue
        if pending:
            violations.append(
                f"message {opened_at}: calls {list(pending)} not answered before message {i}"
            )
        pending = dict.fromkeys(call_ids(message))
        opened_at = i
    return violations


@dataclass(frozen=True, slots=True)
class OpenCalls:
    """Tool calls at the view's tail still waiting for their results.

    ``call`` is the assistant message that made them, ``after`` the last message of
    the unit so far (where synthetic results go), ``missing`` the unanswered ids.
    """

    call: ViewItem
    missing: tuple[str, ...]
    after: ViewItem


def open_calls_at_tail(view: Sequence[ViewItem]) -> OpenCalls | None:
    """The calls the last unit of ``view`` still waits for, if any."""
    if not view:
        return None
    last = group_units(view)[-1]
    if last.missing and not last.orphan:
        return OpenCalls(view[last.start], tuple(last.missing), view[last.stop - 1])
    return None


def track_open_calls(open_calls: OpenCalls | None, item: ViewItem) -> OpenCalls | None:
    """What is still open once ``item`` is appended after ``open_calls``."""
    calls = tool_calls(item.message)
    if calls:
        return OpenCalls(item, tuple(c[0] for c in calls), item)
    answered = set(result_ids(item.message)) - {""}
    if open_calls is not None and answered & set(open_calls.missing):
        missing = tuple(m for m in open_calls.missing if m not in answered)
        return OpenCalls(open_calls.call, missing, item) if missing else None
    return None
