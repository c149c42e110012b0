"""Budgets, usage, model changes, request views and persisted compaction through Session."""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

import pytest

from contextledger import (
    CompactionError,
    ConcurrencyError,
    IdempotencyConflict,
    InvalidArgument,
    InvalidMessage,
    Ledger,
)
from contextledger.core.budget import thresholds_for
from contextledger.core.model_limits import model_limits
from contextledger.core.projection import fold
from contextledger.core.units import NO_RESULT_TEXT, provider_valid
from contextledger.hooks import CompactDecision


def turn(i: int, size: int = 200) -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": f"question {i}: " + "word " * size},
        {"role": "assistant", "content": f"answer {i}: " + "text " * size},
    ]


def tool_turn(i: int, output: str = "ok") -> list[dict[str, Any]]:
    return [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": f"call_{i}",
                    "type": "function",
                    "function": {"name": "read_file", "arguments": f'{{"n": {i}}}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": f"call_{i}", "content": output},
    ]


async def fill(session: Any, turns: int, size: int = 200) -> None:
    for i in range(turns):
        for message in turn(i, size):
            await session.add_message(message)


async def ledger_snapshot(session: Any) -> list[tuple[int, str, str]]:
    return [(e.seq, e.type, e.hash) async for e in session.events()]


class Provider:
    """An Amplifier-style provider: get_info().defaults carries the limits."""

    def __init__(self, window: int, max_output: int) -> None:
        self.window, self.max_output = window, max_output

    def get_info(self) -> Any:
        return SimpleNamespace(
            defaults={"context_window": self.window, "max_output_tokens": self.max_output}
        )


async def test_usage_reports_tokens_budget_and_state(ledger: Ledger) -> None:
    session = await ledger.session("usage", model="gpt-4o")
    await fill(session, 3)
    u = await session.usage()
    limits = model_limits("gpt-4o")
    assert u.tokens == sum(i.tokens for i in await session.view_items())
    assert u.budget == session.budget().available
    assert u.budget < limits.context_window
    assert u.fraction == pytest.approx(u.tokens / u.budget)
    assert str(u.state) == "healthy"
    # a tiny explicit window makes the same session critical / overflowing
    small = await session.usage(max_tokens=None, model=None)
    assert small.tokens == u.tokens
    tight = await ledger.session("usage-tight", config={"max_tokens": u.tokens})
    await fill(tight, 3)
    assert str((await tight.usage()).state) == "overflow"


async def test_budget_sources_token_budget_provider_model(ledger: Ledger) -> None:
    session = await ledger.session("budget", model="gpt-4o")
    assert session.budget(5000).available == 5000
    with pytest.raises(InvalidArgument):
        session.budget(0)
    from_provider = session.budget(provider=Provider(32_000, 4_000)).available
    # window - the provider's max output - the safety margin (2% of a 32K window = 640)
    assert from_provider == 32_000 - 4_000 - math.ceil(32_000 * 0.02)
    capped = await ledger.session("budget-cap", model="gpt-4o", config={"max_tokens": 10_000})
    assert capped.budget().available == 10_000
    assert capped.budget(provider=Provider(32_000, 4_000)).available == 10_000


async def test_state_thresholds_follow_profile(ledger: Ledger) -> None:
    session = await ledger.session(
        "profile", config={"profile": "conservative", "max_tokens": 1000}
    )
    await session.add_message({"role": "user", "content": "x " * 1400})
    u = await session.usage()
    t = thresholds_for(None, "conservative")
    expected = (
        "overflow"
        if u.fraction >= t.overflow
        else "critical"
        if u.fraction >= t.critical
        else "warning"
        if u.fraction >= t.warning
        else "healthy"
    )
    assert str(u.state) == expected


async def test_model_change_recounts_the_view_once(ledger: Ledger) -> None:
    session = await ledger.session("model", model="gpt-4o", config={"token_counter": "chars"})
    await fill(session, 2)
    old = [i.tokens for i in await session.view_items()]
    await session.set_model("claude-sonnet-4-20250514")
    assert session.model == "claude-sonnet-4-20250514"
    events = [e async for e in session.events()]
    assert events[-1].type == "model.changed"
    assert len(events) == 6  # created, 4 messages, one model.changed: history not recounted
    new = [i.tokens for i in await session.view_items()]
    assert new == [session.counter.count_message(m) for m in await session.view()]
    assert await session.get_token_count() == sum(new)
    assert len(new) == len(old)
    reopened = await ledger.session("model", create=False)
    assert reopened.model == "claude-sonnet-4-20250514"


async def test_request_view_fits_budget_and_writes_nothing(ledger: Ledger) -> None:
    session = await ledger.session("request", config={"token_counter": "chars"})
    await session.add_message({"role": "system", "content": "be brief"})
    await fill(session, 20)
    for i in range(3):
        for m in tool_turn(i, "data " * 100):
            await session.add_message(m)
    await session.add_message({"role": "user", "content": "last question"})
    before = await ledger_snapshot(session)
    history = await session.get_messages()
    total = await session.get_token_count()
    budget = total // 3
    sent = await session.get_messages_for_request(token_budget=budget)
    assert session.counter.count_messages(sent) - 3 <= budget
    assert sent[0] == {"role": "system", "content": "be brief"}
    assert sent[-1] == {"role": "user", "content": "last question"}
    assert provider_valid(sent) == []
    assert await ledger_snapshot(session) == before
    assert await session.get_messages() == history


def stable_prefix(request: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A request up to its recall block (the whole request when it has none)."""
    for n, message in enumerate(request):
        if str(message.get("content", "")).startswith("<recall>"):
            return request[:n]
    return request


async def test_request_prefix_is_stable_between_passes(ledger: Ledger) -> None:
    session = await ledger.session("prefix", config={"token_counter": "chars"})
    await fill(session, 30, size=50)
    budget = (await session.get_token_count()) * 2 // 3
    first = await session.get_messages_for_request(token_budget=budget)
    changes = 0
    previous = first
    for i in range(30, 34):
        for m in turn(i, 5):
            await session.add_message(m)
        sent = await session.get_messages_for_request(token_budget=budget)
        # the old request's stable prefix (all of it but its recall block and the latest
        # turn after it) stays a prefix of the new one, except at a compaction boundary
        prefix = stable_prefix(previous)
        if sent[: len(prefix)] != prefix:
            changes += 1
        # what was sent is what a replay of the ledger reproduces
        assert await session.request_at(session.request_seq, token_budget=budget) == sent
        previous = sent
    assert changes <= 1


async def test_no_room_for_the_protected_core_is_a_typed_error(ledger: Ledger) -> None:
    session = await ledger.session("core")
    await session.add_message({"role": "system", "content": "rules " * 400})
    await session.add_message({"role": "user", "content": "hi"})
    with pytest.raises(CompactionError) as err:
        await session.get_messages_for_request(token_budget=50)
    assert err.value.code == "NO_TOKEN_BUDGET"


async def test_compact_persists_and_rollback_undoes_it(ledger: Ledger) -> None:
    session = await ledger.session(
        "compact",
        config={"token_counter": "chars", "compaction_strategy": "priority", "max_tokens": 4000},
    )
    await session.add_message({"role": "system", "content": "sys"})
    await fill(session, 12)
    history = await session.get_messages()
    view_before = await session.view()
    tokens_before = await session.get_token_count()
    seen: list[tuple[str, dict[str, Any]]] = []
    session.hooks.on("*", lambda name, data: seen.append((name, data)))
    saved = await session.compact()
    assert saved > 0
    assert await session.get_token_count() == tokens_before - saved
    # filled to the target from the newest, the last keep_recent messages a floor:
    # here they alone pass the target, so they stay (within the budget) and nothing older
    view = await session.view()
    assert await session.get_token_count() <= 4000
    assert view[-10:] == history[-10:] and view[0] == history[0]
    events = [e async for e in session.events()]
    assert [e.type for e in events[-2:]] == ["checkpoint.created", "compaction.applied"]
    assert events[-2].payload.label == "auto:pre-compact"
    assert await session.get_messages() == history  # history untouched
    assert await session.view_at(session.head) == await session.view()
    assert [dict(i.message) for i in fold(events).view] == await session.view()
    assert all(r.ok for r in await ledger.rebuild(session.session_id))
    names = [n for n, _ in seen]
    assert names.index("context:pre_compact") < names.index("context:post_compact")
    post = dict(seen[names.index("context:post_compact")][1])
    assert post["tokens_saved"] == saved and post["strategy"] == "priority"
    await session.rollback("auto:pre-compact")
    assert await session.view() == view_before


async def test_pre_compact_cancel_writes_nothing(ledger: Ledger) -> None:
    session = await ledger.session("cancel", config={"max_tokens": 2000, "token_counter": "chars"})
    await fill(session, 8)
    head = session.head

    async def veto(ctx: Any) -> CompactDecision:
        assert ctx.trigger == "manual" and ctx.current_tokens > ctx.target_tokens
        return CompactDecision(cancel=True)

    session.pre_compact = veto
    assert await session.compact() == 0
    assert session.head == head


async def test_manage_prunes_at_warning_and_compacts_when_critical(ledger: Ledger) -> None:
    cfg: dict[str, Any] = {
        "token_counter": "chars",
        "max_tool_output_chars": 1000,
        "protect_recent_tool_results": 0,
        "profile": "balanced",
    }
    session = await ledger.session("manage", config=cfg)
    await session.add_message({"role": "user", "content": "start"})
    for m in tool_turn(1, "line of output\n" * 320):  # ~4,800 chars: one big tool result
        await session.add_message(m)
    await session.add_message({"role": "assistant", "content": "done reading"})
    tokens = await session.get_token_count()
    # size the budget so the session sits at 80%: balanced says "warning" (0.75..0.85)
    session = await ledger.session("manage", config={"max_tokens": math.ceil(tokens / 0.80)})
    u = await session.usage()
    assert str(u.state) == "warning", u
    result = await session.manage()
    assert result.state == "warning"
    assert result.actions and "pruned" in result.actions[0]
    assert result.tokens_after < result.tokens_before
    tool = next(m for m in await session.view() if m["role"] == "tool")
    assert "[truncated: ~" in tool["content"]
    history_tool = next(m for m in await session.get_messages() if m["role"] == "tool")
    assert "[truncated" not in history_tool["content"]
    await fill(session, 6, size=120)
    assert str((await session.usage()).state) in ("critical", "overflow")
    result = await session.manage()
    assert result.actions and result.tokens_after < result.tokens_before
    # the last keep_recent messages are a floor that gives way only to fit the budget
    assert str((await session.usage()).state) != "overflow"
    assert (await session.view())[-2:] == (await session.get_messages())[-2:]


async def test_auto_compact_on_add_message(ledger: Ledger) -> None:
    session = await ledger.session(
        "auto", config={"token_counter": "chars", "max_tokens": 3000, "auto_compact": True}
    )
    await fill(session, 12, size=120)  # ~155 tokens a message, ~3,700 in all
    types = [e.type async for e in session.events()]
    assert "compaction.applied" in types
    assert await session.get_token_count() <= 3000
    # auto compaction is bounded: far fewer passes than messages (no storm)
    assert types.count("compaction.applied") <= 24 // 4


async def test_unanswered_tool_call_gets_one_recorded_synthetic_result(ledger: Ledger) -> None:
    session = await ledger.session("orphan-call")
    await session.add_message({"role": "user", "content": "go"})
    await session.add_message(
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}},
                {"id": "c2", "type": "function", "function": {"name": "g", "arguments": "{}"}},
            ],
        }
    )
    await session.add_message({"role": "tool", "tool_call_id": "c1", "content": "one"})
    # the user moves on: c2 will never be answered
    seq = await session.add_message({"role": "user", "content": "never mind"})
    view = await session.view()
    assert provider_valid(view) == []
    assert view[3] == {"role": "tool", "tool_call_id": "c2", "content": NO_RESULT_TEXT, "name": "g"}
    events = [e async for e in session.events()]
    assert events[-1].seq == seq and events[-2].payload.origin == "synthetic"
    # recorded once: a resumed session does not add another
    resumed = await ledger.session("orphan-call", create=False)
    await resumed.add_message({"role": "assistant", "content": "ok"})
    assert (
        sum(
            1
            for e in [e async for e in resumed.events()]
            if getattr(e.payload, "origin", None) == "synthetic"
        )
        == 1
    )


async def test_add_messages_closes_open_calls_in_the_same_batch(ledger: Ledger) -> None:
    """add_messages shares add_message's synthetic results: recorded in the batch, once,
    and not when the batch's first message answers the open call."""
    session = await ledger.session("orphan-batch")
    call = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
        ],
    }
    await session.add_messages([{"role": "user", "content": "go"}, call])
    seqs = await session.add_messages(
        [{"role": "user", "content": "never mind"}, {"role": "assistant", "content": "ok"}]
    )
    events = [e async for e in session.events()]
    assert [e.seq for e in events[-2:]] == seqs
    assert events[-3].payload.origin == "synthetic" and events[-3].seq == seqs[0] - 1
    view = await session.view()
    assert provider_valid(view) == []
    assert view[2] == {"role": "tool", "tool_call_id": "c1", "content": NO_RESULT_TEXT, "name": "f"}
    # a batch that starts with the answer gets no synthetic result
    await session.add_messages([{**call, "tool_calls": [{**call["tool_calls"][0], "id": "c2"}]}])
    answered = await session.add_messages(
        [{"role": "tool", "tool_call_id": "c2", "content": "two"}, {"role": "user", "content": "k"}]
    )
    after = [e async for e in session.events()]
    assert after[-2].seq == answered[0] and after[-2].payload.origin != "synthetic"
    assert sum(1 for e in after if getattr(e.payload, "origin", None) == "synthetic") == 1


async def test_add_messages_takes_a_key_and_an_expected_head_for_the_batch(
    ledger: Ledger,
) -> None:
    """A batch's retry returns its seqs and writes nothing; the key reused for other
    messages, an open call's synthetic result in between, or a stale head are refused
    with nothing written."""
    session = await ledger.session("keyed-batch")
    batch = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    seqs = await session.add_messages(batch, idempotency_key="k", expected_seq=1)
    assert seqs == [2, 3]
    assert await session.add_messages(batch, idempotency_key="k") == seqs
    for other in (
        [{"role": "user", "content": "z"}, {"role": "assistant", "content": "b"}],
        [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}] * 2,
        [{"role": "assistant", "content": "b"}, {"role": "assistant", "content": "b"}],
    ):
        with pytest.raises(IdempotencyConflict):
            await session.add_messages(other, idempotency_key="k")
    with pytest.raises(ConcurrencyError):
        await session.add_messages(batch, expected_seq=2)
    with pytest.raises(InvalidArgument):
        await session.add_messages(batch, idempotency_key="")
    with pytest.raises(InvalidArgument):
        await session.add_messages(batch, expected_seq=-1)
    assert [e.seq async for e in session.events()] == [1, 2, 3]
    assert await session.add_messages(batch, idempotency_key="k2", expected_seq=3) == [4, 5]


async def test_work_in_progress_call_at_the_tail_is_left_alone(ledger: Ledger) -> None:
    session = await ledger.session("wip")
    await session.add_message({"role": "user", "content": "go"})
    await session.add_message(
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
            ],
        }
    )
    sent = await session.get_messages_for_request(token_budget=10_000)
    assert sent[-1]["tool_calls"][0]["id"] == "c1"
    assert len(sent) == 2


async def test_hooks_message_added_include_and_failing_listener(ledger: Ledger) -> None:
    session = await ledger.session("hooks")
    seen: list[tuple[str, dict[str, Any]]] = []

    def broken(name: str, data: dict[str, Any]) -> None:
        raise RuntimeError("listener bug")

    session.hooks.on("context:message_added:debug", broken)
    session.hooks.on("*", lambda name, data: seen.append((name, data)))
    await session.add_message({"role": "user", "content": "hello"})
    await session.include("retriever", "doc: the port is 8443")
    names = [n for n, _ in seen]
    assert names == [
        "context:message_added:debug",
        "context:message_added:debug",
        "context:include",
    ]
    assert seen[0][1]["role"] == "user" and seen[0][1]["content_length"] == 5
    assert seen[2][1] == {"source": "retriever", "content": "doc: the port is 8443", "seq": 3}
    assert (await session.view())[-1] == {"role": "system", "content": "doc: the port is 8443"}


async def test_another_writer_answering_a_call_is_not_marked_unanswered(pg_dsn: str) -> None:
    """Regression: a tool result written by another process got a synthetic result too."""
    async with Ledger.open(pg_dsn) as one, Ledger.open(pg_dsn) as two:
        a = await one.session("shared")
        await a.add_message({"role": "user", "content": "weather?"})
        await a.add_message(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "weather", "arguments": "{}"},
                    }
                ],
            }
        )
        b = await two.session("shared", create=False)
        await b.add_message({"role": "tool", "tool_call_id": "call_1", "content": "sunny"})
        await a.add_message({"role": "assistant", "content": "It is sunny."})
        tools = [m for m in await a.get_messages() if m["role"] == "tool"]
        assert tools == [{"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]


async def test_a_rejected_append_keeps_the_open_call_for_the_next(ledger: Ledger) -> None:
    """Regression: a rejected append forgot which tool calls were still open."""
    session = await ledger.session("open-call")
    await session.add_message({"role": "user", "content": "go"})
    await session.add_message(
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c9", "type": "function", "function": {"name": "f", "arguments": "{}"}}
            ],
        }
    )
    with pytest.raises(ConcurrencyError):
        await session.add_message({"role": "user", "content": "x"}, expected_seq=1)
    await session.add_message({"role": "user", "content": "moving on"})
    messages = await session.get_messages()
    assert messages[2]["content"] == NO_RESULT_TEXT and messages[3]["content"] == "moving on"


async def test_session_call_with_a_bad_model_writes_nothing(ledger: Ledger) -> None:
    """Regression: ledger.session() with an invalid model wrote a config event first."""
    session = await ledger.session("atomic", config={"keep_recent": 4})
    head = session.head
    with pytest.raises(InvalidArgument):
        await ledger.session("atomic", config={"keep_recent": 8}, model="bad\ud800")
    assert (await ledger.session("atomic")).head == head


async def test_token_counts_beyond_the_column_are_rejected(ledger: Ledger) -> None:
    """Regression: a count past the 32-bit tokens column reached PostgreSQL raw."""
    session = await ledger.session("huge", config={"token_counter": "chars:0.001"})
    with pytest.raises(InvalidMessage) as err:
        await session.add_message({"role": "user", "content": "x" * 2_500_000})
    assert err.value.details["field"] == "tokens"
    assert session.head == 1


async def test_rollback_brings_back_the_counter_of_the_model(ledger: Ledger) -> None:
    """Regression: rollback restored the model but kept the newer model's counter."""
    session = await ledger.session("counter", model="gpt-4o")
    before = session.counter.name
    cp = await session.checkpoint("before-switch")
    await session.set_model("claude-sonnet-4-20250514")
    assert session.counter.name != before
    await session.rollback(cp)
    assert session.model == "gpt-4o"
    assert session.counter.name == before
    assert (await ledger.session("counter")).counter.name == before


@pytest.mark.parametrize(
    "call",
    [
        lambda led, s: led.session("meta", metadata=[1]),
        lambda led, s: led.session("\ud800"),
        lambda led, s: s.record_summary(2, 2, "sum", audit=[1]),
        lambda led, s: s.add_message({"role": "user", "content": "n", "n": 10**5000}),
        lambda led, s: s.add_message(
            {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "function": 5}]}
        ),
        lambda led, s: s.add_message({"role": "user", "content": "k"}, idempotency_key="\ud800"),
        lambda led, s: s.checkpoint("\ud800"),
        lambda led, s: s.usage(max_tokens="x"),
        lambda led, s: s.usage(model=5),
        lambda led, s: s.view_at(2**70),
    ],
)
async def test_bad_arguments_raise_typed_errors_and_write_nothing(
    ledger: Ledger, call: Any
) -> None:
    """Regression: bad arguments raised TypeError or ValueError, or wrote, not InvalidArgument."""
    session = await ledger.session("typed")
    await session.add_message({"role": "user", "content": "one"})
    with pytest.raises((InvalidArgument, InvalidMessage)):
        await call(ledger, session)
    assert [e.seq async for e in session.events()] == [1, 2]


async def test_request_state_notices_a_view_rewritten_by_another_process(pg_dsn: str) -> None:
    """Turns this process dropped ephemerally must come back when another process rolls
    the view back to a point where they fit again."""
    async with Ledger.open(pg_dsn) as one, Ledger.open(pg_dsn) as two:
        a = await one.session("stale", config={"token_counter": "chars"})
        for i in range(20):
            await a.add_message(
                {
                    "role": "user" if i % 2 == 0 else "assistant",
                    "content": f"turn {i} " + "word " * 40,
                }
            )
        # 8 turns fit the part of it the view may use (the recall share is kept apart)
        budget = (await a.get_token_count()) * 2 // 3
        first = await a.get_messages_for_request(token_budget=budget)
        assert len(first) < 20  # this process dropped old turns, ephemerally
        b = await two.session("stale", create=False)
        await b.rollback(9)  # seqs 2..9: the first 8 turns, which fit the budget
        sent = await a.get_messages_for_request(token_budget=budget)
        assert sent == await b.view()
        assert len(sent) == 8


async def test_footprint_estimates_what_a_session_handle_holds(pg_dsn: str) -> None:
    """The estimate the service's cache bounds its bytes by, against tracemalloc's count of
    what reopening a session and building two requests allocates and keeps (PostgreSQL:
    what the service caches; ``memory://`` holds its sessions in the store anyway)."""
    async with Ledger.open(pg_dsn) as ledger:
        await _footprint_against_tracemalloc(ledger)


async def _footprint_against_tracemalloc(ledger: Ledger) -> None:
    import gc
    import tracemalloc

    session = await ledger.session("footprint", create=True, model="gpt-4o")
    words = ["harbor", "orchard", "quarry", "lantern", "meadow", "river", "1,204", "Oslo"]
    for i in range(300):
        text = " ".join(words[(i * 7 + j) % len(words)] for j in range(60))
        await session.add_message({"role": ("user", "assistant")[i % 2], "content": text})
    del session
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        again = await ledger.session("footprint")
        await again.get_messages_for_request()
        await again.add_message({"role": "user", "content": "what about the harbor"})
        await again.get_messages_for_request()
        gc.collect()
        held = sum(s.size_diff for s in tracemalloc.take_snapshot().compare_to(before, "filename"))
    finally:
        tracemalloc.stop()
    assert held > 0
    assert 0.5 <= again.footprint / held <= 2.0, (again.footprint, held)


async def test_branch_seq_reads_the_branch_the_events_fold_to(ledger: Ledger) -> None:
    session = await ledger.session("branch-seq", create=True, model="gpt-4o")
    for i in range(4):
        await session.add_message({"role": "user", "content": f"before {i}"})
    await session.set_messages([{"role": "user", "content": f"restored {i}"} for i in range(3)])
    for i in range(3):
        await session.add_message({"role": "assistant", "content": f"after {i}"})
    await session.checkpoint("c")
    await session.add_message({"role": "user", "content": "dropped by the rollback"})
    await session.rollback("c")
    await session.add_message({"role": "user", "content": "last"})
    state = fold([e async for e in session.events()])
    expected = [item.seq for item in state.branch]
    assert len(expected) == 7
    assert [await session.branch_seq(i) for i in range(len(expected) + 2)] == [
        *expected,
        None,
        None,
    ]
    with pytest.raises(InvalidArgument):
        await session.branch_seq(-1)


@pytest.mark.parametrize(
    "bad", ["line\nbreak", "esc\x1b[31mred", "tab\there", "admin\u202egnp.exe", "a\u2066b"]
)
async def test_a_new_session_id_holds_no_control_or_bidi_character(
    ledger: Ledger, bad: str
) -> None:
    """Such an id makes one session read as another in a table, a log line or the audit
    page; refused where a session is created (open, fork, import), nothing written. An id
    already in a ledger (written before the rule) stays reachable."""
    from contextledger.appends import utc_now
    from contextledger.core.events import SessionCreated
    from contextledger.transfer import export_lines, import_lines

    before = [i.session_id for i in await ledger.sessions()]
    with pytest.raises(InvalidArgument, match="control or bidirectional"):
        await ledger.session(bad)
    source = await ledger.session("clean-source")
    await source.add_message({"role": "user", "content": "hi"})
    with pytest.raises(InvalidArgument, match="control or bidirectional"):
        await ledger.fork("clean-source", bad)
    lines = [line async for line in export_lines(ledger, "clean-source")]
    with pytest.raises(InvalidArgument, match="control or bidirectional"):
        await import_lines(ledger, lines, session_id=bad)
    assert [i.session_id for i in await ledger.sessions()] == [*before, "clean-source"]
    await ledger.store.create_session(  # as a ledger written before the rule holds it
        bad, SessionCreated(None, {}, {}), created_at=utc_now()
    )
    old = await ledger.session(bad)
    await old.add_message({"role": "user", "content": "still reachable"})
    assert (await ledger.session(bad, create=False)).head == 2
