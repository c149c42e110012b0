"""The ledger through the public API, on both stores (PostgreSQL and memory://)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from contextledger import (
    Checkpoint,
    CheckpointNotFound,
    ConcurrencyError,
    IdempotencyConflict,
    InvalidArgument,
    InvalidMessage,
    Ledger,
    SeqOutOfRange,
    SessionNotFound,
)
from contextledger.core.projection import fold

OPENAI_TOOL_TURN: list[dict[str, Any]] = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "What's in /etc/hosts?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "read_file", "arguments": '{"path": "/etc/hosts"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "127.0.0.1 localhost"},
    {"role": "assistant", "content": "Just localhost."},
]
ANTHROPIC_TOOL_TURN: list[dict[str, Any]] = [
    {"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"}]},
    {
        "role": "assistant",
        "content": [
            {"type": "thinking", "thinking": "need a tool", "signature": "sig=="},
            {
                "type": "tool_use",
                "id": "toolu_1",
                "name": "weather",
                "input": {"city": "Paris", "days": 2, "t": 1.5},
            },
        ],
    },
    {
        "role": "user",
        "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": "18°C, 天気は晴れ"}
        ],
    },
]


async def events_of(session: Any) -> list[Any]:
    return [e async for e in session.events()]


async def test_messages_round_trip_in_both_shapes_without_mutation(ledger: Ledger) -> None:
    session = await ledger.session("shapes", model="gpt-4o")
    given = copy.deepcopy(OPENAI_TOOL_TURN + ANTHROPIC_TOOL_TURN)
    for message in given:
        await session.add_message(message)
    assert given == OPENAI_TOOL_TURN + ANTHROPIC_TOOL_TURN  # caller's dicts untouched
    assert await session.get_messages() == given
    assert await session.view() == given
    # the returned lists are copies: mutating them changes nothing stored
    got = await session.get_messages()
    got[0]["content"] = "changed"
    assert (await session.get_messages())[0]["content"] == "You are terse."
    reopened = await ledger.session("shapes", create=False)
    assert await reopened.get_messages() == given


async def test_seqs_are_gapless_and_session_created_is_first(ledger: Ledger) -> None:
    session = await ledger.session("gapless", metadata={"user": "ada"})
    seqs = [await session.add_message({"role": "user", "content": f"m{i}"}) for i in range(5)]
    assert seqs == [2, 3, 4, 5, 6]
    events = await events_of(session)
    assert [e.seq for e in events] == list(range(1, 7))
    assert events[0].type == "session.created"
    assert events[0].payload.metadata == {"user": "ada"}
    assert [e.type for e in events[1:]] == ["message.appended"] * 5
    positions = [e.position for e in events]
    assert positions == sorted(positions) and len(set(positions)) == len(positions)
    assert session.head == 6


async def test_checkpoint_rollback_by_label_checkpoint_and_seq(ledger: Ledger) -> None:
    session = await ledger.session("rb")
    await session.add_message({"role": "user", "content": "a"})
    cp = await session.checkpoint("before-b")
    assert isinstance(cp, Checkpoint) and cp.label == "before-b"
    await session.add_message({"role": "user", "content": "b"})
    await session.add_message({"role": "user", "content": "c"})
    full = await session.view()

    await session.rollback("before-b")
    assert await session.view() == [{"role": "user", "content": "a"}]
    assert await session.get_messages() == [{"role": "user", "content": "a"}]
    await session.add_message({"role": "user", "content": "d"})

    # roll back past the rollback: the view as of seq 5 (a, b, c) returns exactly
    await session.rollback(5)
    assert await session.view() == full
    await session.rollback(cp)
    assert await session.view() == [{"role": "user", "content": "a"}]
    # every event stays in the ledger
    types = [e.type for e in await events_of(session)]
    assert types.count("message.appended") == 4
    assert types.count("session.rolled_back") == 3
    assert [c.label for c in await session.checkpoints()] == ["before-b"]


async def test_the_branch_base_is_the_last_rollback_or_clear(ledger: Ledger) -> None:
    session = await ledger.session("base")
    store = ledger.store
    await session.add_message({"role": "user", "content": "a"})
    assert await store.branch_base("base") == 0  # never rolled back
    await session.add_message({"role": "user", "content": "b"})
    rolled = await session.rollback(2)
    assert await store.branch_base("base") == rolled
    await session.add_message({"role": "user", "content": "c"})
    assert await store.branch_base("base") == rolled  # an append keeps the branch
    await session.set_messages([{"role": "user", "content": "d"}])
    assert await store.branch_base("base") == session.head


async def test_nested_rollbacks_replay_to_the_inline_view(ledger: Ledger) -> None:
    session = await ledger.session("nested")
    for text in "abc":
        await session.add_message({"role": "user", "content": text})
    # seqs: 1 created, 2 a, 3 b, 4 c
    await session.rollback(2)  # 5: view a
    await session.add_message({"role": "assistant", "content": "x"})  # 6: a, x
    await session.rollback(4)  # 7: back past the rollback to a, b, c
    await session.add_message({"role": "assistant", "content": "y"})  # 8: a, b, c, y
    await session.rollback(6)  # 9: a, x
    inline = await session.view()
    assert inline == [{"role": "user", "content": "a"}, {"role": "assistant", "content": "x"}]
    assert inline == [dict(i.message) for i in fold(await events_of(session)).view]
    assert await session.view_at(session.head) == inline
    assert await session.view_at(7) == [
        {"role": "user", "content": "a"},
        {"role": "user", "content": "b"},
        {"role": "user", "content": "c"},
    ]


async def test_summary_replaces_view_range_but_not_history(ledger: Ledger) -> None:
    session = await ledger.session("summ")
    await session.add_message({"role": "system", "content": "sys"})
    for i in range(6):
        await session.add_message(
            {"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i}"}
        )
    history = await session.get_messages()
    seq = await session.record_summary(3, 6, "turns 1-4 summarized", audit={"model": "x"})
    view = await session.view()
    assert view[0] == {"role": "system", "content": "sys"}
    assert view[1] == {"role": "user", "content": "turns 1-4 summarized"}
    assert view[2:] == history[5:]
    assert await session.get_messages() == history
    summary_event = await anext(session.events(seq, seq))
    assert summary_event.payload.audit == {"model": "x"}
    # rolling: a second summary covering the first replaces both
    await session.record_summary(2, seq, "everything so far")
    assert await session.view() == [{"role": "user", "content": "everything so far"}]
    # the tokens total follows the view
    items = await session.view_items()
    assert await session.get_token_count() == sum(i.tokens for i in items)


async def test_set_messages_and_clear(ledger: Ledger) -> None:
    session = await ledger.session("replace")
    await session.add_message({"role": "user", "content": "old"})
    restored = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
    await session.set_messages(restored)
    assert await session.get_messages() == restored
    assert await session.view() == restored
    await session.add_message({"role": "assistant", "content": "a"})
    assert len(await session.get_messages()) == 3
    await session.clear()
    assert await session.get_messages() == []
    assert await session.view() == []
    assert await session.get_token_count() == 0
    await session.rollback(3)
    assert await session.get_messages() == restored


async def test_idempotent_retry_returns_original_seq_and_writes_nothing(ledger: Ledger) -> None:
    session = await ledger.session("idem")
    msg = {"role": "user", "content": "once"}
    first = await session.add_message(msg, idempotency_key="req-1")
    again = await session.add_message(msg, idempotency_key="req-1")
    assert first == again == 2
    # even with a stale expected_seq, a retry is recognised as the same append
    assert await session.add_message(msg, idempotency_key="req-1", expected_seq=1) == 2
    assert len(await events_of(session)) == 2
    with pytest.raises(IdempotencyConflict):
        await session.add_message({"role": "user", "content": "other"}, idempotency_key="req-1")
    assert len(await events_of(session)) == 2


async def test_expected_seq_mismatch_is_a_conflict_and_writes_nothing(ledger: Ledger) -> None:
    session = await ledger.session("occ")
    assert await session.add_message({"role": "user", "content": "1"}, expected_seq=1) == 2
    with pytest.raises(ConcurrencyError) as err:
        await session.add_message({"role": "user", "content": "2"}, expected_seq=1)
    assert err.value.code == "CONCURRENCY_CONFLICT"
    assert err.value.details["head"] == 2
    assert len(await events_of(session)) == 2


BAD_MESSAGES: list[tuple[Any, str]] = [
    ({"role": "wizard", "content": "x"}, "role"),
    ({"role": "user"}, "content"),
    ({"role": "user", "content": None}, "content"),
    ({"role": "tool", "content": "r"}, "tool_call_id"),
    ({"role": "user", "content": {"set"}}, "content"),
    ({"role": "user", "content": "x", "meta": {"when": object()}}, "message.meta.when"),
    ({"role": "user", "content": "x", "n": float("nan")}, "message.n"),
    ({"role": "user", "content": "x", "k": {1: "int key"}}, "message.k"),
    ({"role": "user", "content": "nul \x00 byte"}, "message.content"),
    ({"role": "user", "content": "x" * (8 * 1024 * 1024 + 1)}, "message"),
    ({"role": "user", "content": [{"text": "no type"}]}, "content[0]"),
    ("just a string", "message"),
]


@pytest.mark.parametrize(("message", "field"), BAD_MESSAGES)
async def test_invalid_messages_say_which_field_and_write_nothing(
    ledger: Ledger, message: Any, field: str
) -> None:
    session = await ledger.session("bad")
    await session.add_message({"role": "user", "content": "fine"})
    with pytest.raises(InvalidMessage) as err:
        await session.add_message(message)
    assert err.value.details["field"] == field
    assert err.value.code == "INVALID_MESSAGE"
    assert len(await events_of(session)) == 2
    with pytest.raises(InvalidMessage):
        await session.set_messages([{"role": "user", "content": "ok"}, message])
    assert len(await events_of(session)) == 2


async def test_bad_arguments_are_typed_errors(ledger: Ledger) -> None:
    with pytest.raises(SessionNotFound):
        await ledger.session("missing", create=False)
    with pytest.raises(InvalidArgument):
        await ledger.session("")
    session = await ledger.session("args")
    with pytest.raises(CheckpointNotFound):
        await session.rollback("nope")
    with pytest.raises(SeqOutOfRange):
        await session.rollback(99)
    with pytest.raises(InvalidArgument):
        await session.record_summary(5, 9, "covers nothing")
    with pytest.raises(InvalidArgument):
        await session.add_message({"role": "user", "content": "x"}, expected_seq=-1)
    with pytest.raises(InvalidArgument):
        await session.checkpoint("123")
    assert len(await events_of(session)) == 1


async def test_ephemeral_messages_live_in_this_process_only(ledger: Ledger) -> None:
    session = await ledger.session("eph")
    await session.add_message({"role": "user", "content": "kept"})
    assert (
        await session.add_message({"role": "user", "content": "fleeting"}, ephemeral=True) is None
    )
    await session.add_message({"role": "assistant", "content": "after"})
    assert [m["content"] for m in await session.view()] == ["kept", "fleeting", "after"]
    assert await session.get_token_count() == sum(i.tokens for i in await session.view_items())
    assert len(await events_of(session)) == 3
    resumed = await ledger.session("eph", create=False)
    assert [m["content"] for m in await resumed.view()] == ["kept", "after"]


async def test_config_change_is_recorded(ledger: Ledger) -> None:
    session = await ledger.session("cfg", config={"keep_recent": 4})
    assert session.config.keep_recent == 4
    again = await ledger.session("cfg", config={"keep_recent": 6})
    assert again.config.keep_recent == 6
    types = [e.type for e in await events_of(again)]
    assert types == ["session.created", "config.changed"]
    same = await ledger.session("cfg", config={"keep_recent": 6})
    assert [e.type for e in await events_of(same)] == types


async def test_verify_and_rebuild_agree_on_a_clean_session(ledger: Ledger) -> None:
    session = await ledger.session("clean")
    for message in OPENAI_TOOL_TURN:
        await session.add_message(message)
    await session.record_summary(3, 4, "asked for hosts")
    report = await ledger.verify("clean")
    assert report.ok and report.events == session.head
    rebuilt = await ledger.rebuild("clean")
    assert [r.ok for r in rebuilt] == [True]
    assert [s.session_id for s in await ledger.sessions()] == ["clean"]


async def test_events_iterator_ranges(ledger: Ledger) -> None:
    session = await ledger.session("iter")
    for i in range(12):
        await session.add_message({"role": "user", "content": str(i)})
    assert [e.seq async for e in session.events(4, 7)] == [4, 5, 6, 7]
    assert [e.seq async for e in session.events(11)] == [11, 12, 13]


async def test_callers_cannot_rewrite_history_through_returned_views(ledger: Ledger) -> None:
    """Regression: mutating a returned view changed what the memory store held."""
    session = await ledger.session("alias")
    await session.add_message({"role": "user", "content": [{"type": "text", "text": "orig"}]})
    for got in (await session.view(), await session.get_messages()):
        got[0]["content"][0]["text"] = "MUTATED"
    items = await session.view_items()
    items[0].message["content"][0]["text"] = "MUTATED"
    assert (await session.view())[0]["content"][0]["text"] == "orig"
    event = [e async for e in session.events()][-1]
    assert event.payload.message["content"][0]["text"] == "orig"
    assert (await session.verify()).ok


async def test_float_subclasses_hash_as_plain_floats(ledger: Ledger) -> None:
    """Regression: a float subclass (numpy.float64) hashed unlike the stored float."""
    session = await ledger.session("fsub")
    await session.add_message({"role": "user", "content": "score", "score": F(3.0)})
    assert (await session.verify()).ok
    await session.add_message({"role": "user", "content": "w", "weight": 1.0, "n": [2.0]})
    got = (await session.view())[-1]
    assert type(got["weight"]) is float and type(got["n"][0]) is float  # not 1 / 2
    assert (await session.verify()).ok


class F(float):
    """A float subclass, as numpy.float64 is."""


async def test_the_audited_purge_on_both_stores(ledger: Ledger) -> None:
    session = await ledger.session("gone")
    await session.add_messages(OPENAI_TOOL_TURN)
    store: Any = ledger.store
    with pytest.raises(InvalidArgument):
        await store.purge("gone", "  ")
    assert len(await session.get_messages()) == len(OPENAI_TOOL_TURN)  # a refused purge: intact
    head = (await session.refresh()).head
    assert await store.purge("gone", "asked to forget") == head
    with pytest.raises(SessionNotFound):
        await ledger.session("gone", create=False)
    with pytest.raises(SessionNotFound):
        await store.purge("gone", "again")
    record = [p for p in await store.purges() if p["session_id"] == "gone"]
    assert [(p["reason"], p["events"]) for p in record] == [("asked to forget", head)]


async def test_sessions_come_a_page_at_a_time_in_creation_order(ledger: Ledger) -> None:
    ids = [f"pg-{i}" for i in range(7)]
    for sid in ids:
        await ledger.session(sid)
    everything = await ledger.sessions()
    assert [s.session_id for s in everything] == ids
    for size in (1, 2, 3, 7, 50):
        seen: list[str] = []
        after = None
        while True:
            page = await ledger.sessions(after=after, limit=size)
            assert len(page) <= size
            seen += [s.session_id for s in page]
            if len(page) < size:
                break
            after = (page[-1].created_at, page[-1].session_id)
        assert seen == ids, size
    for bad in ({"limit": 0}, {"limit": True}, {"after": ("2026", "x")}, {"after": (1,)}):
        with pytest.raises(InvalidArgument):
            await ledger.sessions(**bad)  # type: ignore[arg-type]
