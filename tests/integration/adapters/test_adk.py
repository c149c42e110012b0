"""LedgerSessionService against the real google-adk package: its types, its Runner."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from typing import Any

import pytest
from google.adk.errors import StaleSessionError
from google.adk.errors.already_exists_error import AlreadyExistsError
from google.adk.errors.session_not_found_error import SessionNotFoundError
from google.adk.events.event import Event
from google.adk.events.event_actions import EventActions
from google.adk.sessions import Session as AdkSession
from google.adk.sessions.base_session_service import GetSessionConfig
from google.genai import types
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contextledger import InvalidArgument, Ledger
from contextledger.adapters.adk import (
    InvalidAdkArgument,
    LedgerSessionService,
    copy_session,
    ledger_session_id,
)
from tests.fakellm import FakeLLM, ok

APP, USER = "weather-app", "ada"


def user_event(text: str, ts: float, **actions: Any) -> Event:
    return Event(
        invocation_id="inv",
        author="user",
        content=types.Content(role="user", parts=[types.Part(text=text)]),
        actions=EventActions(**actions),
        timestamp=ts,
        id=Event.new_id(),
    )


async def test_create_get_list_delete_mirror_adk(ledger: Ledger) -> None:
    service = LedgerSessionService(ledger=ledger)
    s1 = await service.create_session(
        app_name=APP,
        user_id=USER,
        session_id="s1",
        state={"topic": "rain", "app:units": "C", "user:name": "Ada", "temp:scratch": 1},
    )
    assert s1.id == "s1" and s1.events == []
    assert s1.state == {"topic": "rain", "app:units": "C", "user:name": "Ada"}
    with pytest.raises(AlreadyExistsError):
        await service.create_session(app_name=APP, user_id=USER, session_id="s1")
    generated = await service.create_session(app_name=APP, user_id=USER)
    assert generated.id and generated.id != "s1"
    assert generated.state == {"app:units": "C", "user:name": "Ada"}  # shared state, merged
    other = await service.create_session(app_name=APP, user_id="bob", session_id="s1")
    assert other.state == {"app:units": "C"}  # bob has no user state

    got = await service.get_session(app_name=APP, user_id=USER, session_id="s1")
    assert got is not None and got.state == s1.state and got.events == []
    assert await service.get_session(app_name=APP, user_id=USER, session_id="nope") is None
    assert await service.get_session(app_name="other", user_id=USER, session_id="s1") is None

    mine = await service.list_sessions(app_name=APP, user_id=USER)
    assert sorted(s.id for s in mine.sessions) == sorted(["s1", generated.id])
    assert all(s.events == [] for s in mine.sessions)
    everyone = await service.list_sessions(app_name=APP)
    assert sorted((s.user_id, s.id) for s in everyone.sessions) == sorted(
        [(USER, "s1"), (USER, generated.id), ("bob", "s1")]
    )
    assert (await service.list_sessions(app_name="other")).sessions == []
    assert await service.get_user_state(app_name=APP, user_id=USER) == {"name": "Ada"}

    await service.delete_session(app_name=APP, user_id=USER, session_id="s1")
    assert await service.get_session(app_name=APP, user_id=USER, session_id="s1") is None
    assert [s.id for s in (await service.list_sessions(app_name=APP, user_id=USER)).sessions] == [
        generated.id
    ]
    await service.delete_session(app_name=APP, user_id=USER, session_id="s1")  # no-op
    again = await service.create_session(app_name=APP, user_id=USER, session_id="s1")
    assert again.events == [] and "topic" not in again.state
    # the deleted incarnation is still in the ledger, audited and verifiable
    history = await ledger.session(ledger_session_id(APP, USER, "s1"), create=False)
    assert (await history.verify()).ok
    assert [m["content"] for m in await history.get_messages()][-2] == "ADK session s1 deleted"


async def test_append_event_applies_state_deltas_with_adk_prefix_rules(ledger: Ledger) -> None:
    service = LedgerSessionService(ledger=ledger)
    session = await service.create_session(app_name=APP, user_id=USER, session_id="s")
    event = user_event(
        "hello",
        1000.0,
        state_delta={"k": 1, "app:a": "x", "user:u": [1, 2], "temp:t": "gone"},
    )
    await service.append_event(session, event)
    assert session.state["temp:t"] == "gone"  # the in-memory session sees temp state
    assert event.actions.state_delta == {"k": 1, "app:a": "x", "user:u": [1, 2]}
    second = user_event("again", 1001.0, state_delta={"k": 2})
    await service.append_event(session, second)

    stored = await service.get_session(app_name=APP, user_id=USER, session_id="s")
    assert stored is not None
    assert stored.state == {"k": 2, "app:a": "x", "user:u": [1, 2]}
    assert stored.events == [event, second]
    assert stored.last_update_time == 1001.0
    sibling = await service.create_session(app_name=APP, user_id=USER, session_id="s2")
    assert sibling.state == {"app:a": "x", "user:u": [1, 2]}
    # a partial (streaming) event is not stored
    partial = user_event("part", 1002.0)
    partial.partial = True
    await service.append_event(stored, partial)
    reread = await service.get_session(app_name=APP, user_id=USER, session_id="s")
    assert reread is not None and len(reread.events) == 2


async def test_get_session_config_reads_recent_and_after_timestamp(ledger: Ledger) -> None:
    service = LedgerSessionService(ledger=ledger)
    session = await service.create_session(app_name=APP, user_id=USER, session_id="s")
    sent = []
    for i in range(300):
        ev = user_event(f"m{i}", 2000.0 + i, state_delta={"n": i} if i % 50 == 0 else {})
        sent.append(await service.append_event(session, ev))

    def texts(s: AdkSession | None) -> list[str]:
        assert s is not None
        return [e.content.parts[0].text for e in s.events]  # type: ignore[index,union-attr]

    def get(config: GetSessionConfig | None) -> Any:
        return service.get_session(app_name=APP, user_id=USER, session_id="s", config=config)

    assert texts(await get(None)) == [f"m{i}" for i in range(300)]
    assert texts(await get(GetSessionConfig(num_recent_events=3))) == ["m297", "m298", "m299"]
    none = await get(GetSessionConfig(num_recent_events=0))
    assert texts(none) == [] and none.state == {"n": 250}
    after = await get(GetSessionConfig(after_timestamp=2295.0))
    assert texts(after) == [f"m{i}" for i in range(295, 300)]
    both = await get(GetSessionConfig(num_recent_events=10, after_timestamp=2297.0))
    assert texts(both) == ["m297", "m298", "m299"]
    assert texts(await get(GetSessionConfig(num_recent_events=1000))) == texts(await get(None))
    assert (await get(GetSessionConfig(num_recent_events=3))).state == {"n": 250}


async def test_a_stale_session_object_cannot_write(ledger: Ledger) -> None:
    """ADK #4751: two holders of one session must not interleave their writes."""
    service = LedgerSessionService(ledger=ledger)
    await service.create_session(app_name=APP, user_id=USER, session_id="s")
    first = await service.get_session(app_name=APP, user_id=USER, session_id="s")
    second = await service.get_session(app_name=APP, user_id=USER, session_id="s")
    assert first is not None and second is not None
    await service.append_event(first, user_event("from first", 3000.0))
    handle = await ledger.session(ledger_session_id(APP, USER, "s"), create=False)
    head = handle.head
    with pytest.raises(StaleSessionError):
        await service.append_event(second, user_event("from second", 3001.0, state_delta={"x": 1}))
    await handle.refresh()
    assert handle.head == head  # nothing written
    # a second service (another process) is refused the same way
    elsewhere = LedgerSessionService(ledger=ledger)
    with pytest.raises(StaleSessionError):
        await elsewhere.append_event(second, user_event("from elsewhere", 3002.0))
    # the first holder goes on; a reloaded session writes again
    await service.append_event(first, user_event("first again", 3003.0))
    fresh = await elsewhere.get_session(app_name=APP, user_id=USER, session_id="s")
    assert fresh is not None
    await elsewhere.append_event(fresh, user_event("reloaded", 3004.0))
    final = await service.get_session(app_name=APP, user_id=USER, session_id="s")
    assert final is not None and "x" not in final.state
    assert [e.content.parts[0].text for e in final.events] == [  # type: ignore[index,union-attr]
        "from first",
        "first again",
        "reloaded",
    ]
    # a hand-built Session (no revision marker) is accepted only if it has seen everything
    behind = AdkSession(id="s", app_name=APP, user_id=USER, events=final.events[:1])
    with pytest.raises(StaleSessionError):
        await service.append_event(behind, user_event("late", 3005.0))
    current = AdkSession(id="s", app_name=APP, user_id=USER, events=list(final.events))
    await service.append_event(current, user_event("caught up", 3006.0))
    missing = AdkSession(id="gone", app_name=APP, user_id=USER)
    with pytest.raises(SessionNotFoundError):
        await service.append_event(missing, user_event("x", 3007.0))


async def test_concurrent_appends_from_one_read_let_exactly_one_through(ledger: Ledger) -> None:
    service = LedgerSessionService(ledger=ledger)
    await service.create_session(app_name=APP, user_id=USER, session_id="s")
    copies = [
        await LedgerSessionService(ledger=ledger).get_session(
            app_name=APP, user_id=USER, session_id="s"
        )
        for _ in range(4)
    ]
    results = await asyncio.gather(
        *(
            LedgerSessionService(ledger=ledger).append_event(c, user_event(f"w{i}", 4000.0 + i))
            for i, c in enumerate(copies)
        ),
        return_exceptions=True,
    )
    assert sum(isinstance(r, Event) for r in results) == 1
    assert all(isinstance(r, StaleSessionError) for r in results if not isinstance(r, Event))
    stored = await service.get_session(app_name=APP, user_id=USER, session_id="s")
    assert stored is not None and len(stored.events) == 1


async def test_constructed_from_a_dsn(pg_dsn: str) -> None:
    async with Ledger.open(pg_dsn):  # the test database is migrated already
        pass
    async with LedgerSessionService(dsn=pg_dsn) as service:
        session = await service.create_session(app_name=APP, user_id=USER, session_id="d")
        await service.append_event(session, user_event("over a dsn", 5000.0))
    async with LedgerSessionService(dsn=pg_dsn) as reopened:
        got = await reopened.get_session(app_name=APP, user_id=USER, session_id="d")
    assert got is not None and len(got.events) == 1
    with pytest.raises(InvalidArgument):
        LedgerSessionService()


async def test_bad_ids_are_typed_value_errors_and_write_nothing(ledger: Ledger) -> None:
    service = LedgerSessionService(ledger=ledger)
    before = len(await ledger.sessions())
    for app, user, sid in (("a" * 150, "u", "s" * 60), ("", "u", "s"), (APP, USER, "")):
        with pytest.raises(InvalidAdkArgument) as bad:
            await service.create_session(app_name=app, user_id=user, session_id=sid)
        assert isinstance(bad.value, ValueError) and bad.value.code == "INVALID_ARGUMENT"
    assert len(await ledger.sessions()) == before
    odd = await service.create_session(app_name="a:b/c", user_id="ü:1", session_id="x y")
    got = await service.get_session(app_name="a:b/c", user_id="ü:1", session_id="x y")
    assert got is not None and got.id == odd.id == "x y"
    assert await service.get_session(app_name="a", user_id="b/c:ü", session_id="1:x y") is None


async def test_copy_session_out_of_adks_database_store_and_back(ledger: Ledger) -> None:
    from google.adk.sessions.database_session_service import DatabaseSessionService

    theirs = DatabaseSessionService(db_url="sqlite+aiosqlite:///:memory:")
    ours = LedgerSessionService(ledger=ledger)
    try:
        original = await theirs.create_session(
            app_name=APP, user_id=USER, session_id="c", state={"a": 1, "user:u": "x"}
        )
        for i in range(5):
            ev = user_event(f"m{i}", 6000.0 + i, state_delta={"a": i, "app:z": i})
            await theirs.append_event(original, ev)
        source = await theirs.get_session(app_name=APP, user_id=USER, session_id="c")
        assert source is not None
        copied = await copy_session(theirs, ours, app_name=APP, user_id=USER, session_id="c")
        stored = await ours.get_session(app_name=APP, user_id=USER, session_id="c")
        assert stored is not None and copied.id == "c"
        assert stored.events == source.events and stored.state == source.state
        back = DatabaseSessionService(db_url="sqlite+aiosqlite:///:memory:")
        try:
            await copy_session(ours, back, app_name=APP, user_id=USER, session_id="c")
            again = await back.get_session(app_name=APP, user_id=USER, session_id="c")
            assert again is not None
            assert again.events == source.events and again.state == source.state
        finally:
            await back.close()
        with pytest.raises(AlreadyExistsError):
            await copy_session(theirs, ours, app_name=APP, user_id=USER, session_id="c")
        with pytest.raises(SessionNotFoundError):
            await copy_session(theirs, ours, app_name=APP, user_id=USER, session_id="none")
    finally:
        await theirs.close()


# -- lossless: Event -> ledger -> Event ---------------------------------------------------

_text = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=20)
_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | _text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_text, inner, max_size=3),
    max_leaves=8,
)
_part = st.one_of(
    st.builds(lambda t: types.Part(text=t), _text),
    st.builds(lambda t: types.Part(text=t, thought=True), _text),
    st.builds(
        lambda n, a, i: types.Part(function_call=types.FunctionCall(name=n, args=a, id=i)),
        st.from_regex(r"[a-z_]{1,8}", fullmatch=True),
        st.dictionaries(_text, _json, max_size=3),
        st.none() | st.from_regex(r"call_[a-z0-9]{1,6}", fullmatch=True),
    ),
    st.builds(
        lambda n, r: types.Part(function_response=types.FunctionResponse(name=n, response=r)),
        st.from_regex(r"[a-z_]{1,8}", fullmatch=True),
        st.dictionaries(_text, _json, max_size=3),
    ),
    st.builds(
        lambda b: types.Part(inline_data=types.Blob(mime_type="image/png", data=b)),
        st.binary(min_size=1, max_size=24),
    ),
)
_events = st.builds(
    lambda role, parts, author, ts, delta, artifacts, escalate, branch, lrt, meta: Event(
        invocation_id="inv-1",
        author=author,
        content=types.Content(role=role, parts=parts) if parts else None,
        actions=EventActions(state_delta=delta, artifact_delta=artifacts, escalate=escalate),
        timestamp=ts,
        branch=branch,
        long_running_tool_ids=lrt,
        custom_metadata=meta,
        id=Event.new_id(),
    ),
    st.sampled_from(["user", "model"]),
    st.lists(_part, max_size=4),
    st.sampled_from(["user", "agent", "weather agent/ü"]),
    st.floats(1e9, 2e9, allow_nan=False),
    st.dictionaries(st.from_regex(r"(app:|user:)?[a-z]{1,5}", fullmatch=True), _json, max_size=3),
    st.dictionaries(st.from_regex(r"[a-z]{1,5}\.txt", fullmatch=True), st.integers(0, 9)),
    st.none() | st.booleans(),
    st.none() | st.from_regex(r"root(\.[a-z]{1,4}){0,2}", fullmatch=True),
    st.none() | st.sets(st.from_regex(r"call_[a-z0-9]{1,4}", fullmatch=True), max_size=3),
    st.none() | st.dictionaries(_text, _json, max_size=2),
)


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(events=st.lists(_events, min_size=1, max_size=4))
async def test_events_round_trip_losslessly(ledger: Ledger, events: list[Event]) -> None:
    service = LedgerSessionService(ledger=ledger)
    session = await service.create_session(app_name=APP, user_id=USER)
    for ev in events:
        await service.append_event(session, ev.model_copy(deep=True))
    stored = await service.get_session(app_name=APP, user_id=USER, session_id=session.id)
    assert stored is not None
    assert stored.events == events
    assert stored.state == session.state


# -- ADK's own Runner ---------------------------------------------------------------------


@pytest.mark.slow
async def test_runner_with_litellm_on_the_fake_server_keeps_the_conversation(
    pg_ledger: Ledger, fake_llm: FakeLLM
) -> None:
    from google.adk.agents import LlmAgent
    from google.adk.models.lite_llm import LiteLlm
    from google.adk.runners import Runner

    fake_llm.script("x", [ok("Oslo is 4 C."), ok("You asked about Oslo.")])
    agent = LlmAgent(
        name="weather",
        model=LiteLlm(model="openai/x", api_base=fake_llm.base_url, api_key="test"),
        instruction="Answer briefly.",
        output_key="last_answer",
    )
    service = LedgerSessionService(ledger=pg_ledger, model="gpt-4o")
    runner = Runner(app_name=APP, agent=agent, session_service=service)
    await service.create_session(app_name=APP, user_id=USER, session_id="run")

    async def turn(text: str) -> list[Event]:
        message = types.Content(role="user", parts=[types.Part(text=text)])
        return [
            e async for e in runner.run_async(user_id=USER, session_id="run", new_message=message)
        ]

    await turn("Weather in Oslo?")
    await turn("What did I ask?")
    second = fake_llm.requests[-1].text
    assert "Weather in Oslo?" in second and "Oslo is 4 C." in second
    stored = await service.get_session(app_name=APP, user_id=USER, session_id="run")
    assert stored is not None
    assert stored.state["last_answer"] == "You asked about Oslo."
    texts = [p.text for e in stored.events for p in (e.content.parts if e.content else []) or []]
    assert texts == ["Weather in Oslo?", "Oslo is 4 C.", "What did I ask?", "You asked about Oslo."]
    ledger_view = await (
        await pg_ledger.session(ledger_session_id(APP, USER, "run"), create=False)
    ).view()
    assert [m["role"] for m in ledger_view][1:] == ["user", "assistant", "user", "assistant"]
    assert (await pg_ledger.verify(ledger_session_id(APP, USER, "run"))).ok


def test_missing_extra_is_a_typed_error_and_contextledger_imports_no_framework() -> None:
    code = """
import sys, importlib.abc
import contextledger
assert not any(m.split('.')[0] in ('google', 'langchain_core', 'langgraph') and m != 'google'
               for m in sys.modules), [m for m in sys.modules if m.startswith(('google.', 'lang'))]
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == 'google.adk' or name.startswith('google.adk.'):
            raise ImportError('blocked: ' + name)
sys.meta_path.insert(0, Block())
try:
    import contextledger.adapters.adk
except contextledger.MissingExtra as exc:
    print(exc.code, exc.details['extra'], str(exc))
"""
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    assert out.startswith("MISSING_EXTRA adk ")
    assert "pip install 'contextledger-pg[adk]'" in out


# -- drop-in: what ADK's own services do (issue 29) ---------------------------------------


def _not_json(x: int) -> int:
    return x + 1


async def test_a_state_value_json_cannot_hold_is_kept_as_adks_database_keeps_it(
    ledger: Ledger,
) -> None:
    from google.adk.sessions import DatabaseSessionService

    adk_own = DatabaseSessionService("sqlite+aiosqlite:///:memory:")
    ours = LedgerSessionService(ledger=ledger)
    stored = []
    for service in (adk_own, ours):
        session = await service.create_session(app_name=APP, user_id=USER, session_id="nj")
        event = user_event("hi", 1000.0, state_delta={"fn": _not_json, "k": 1})
        await service.append_event(session, event)
        again = await service.get_session(app_name=APP, user_id=USER, session_id="nj")
        assert again is not None
        assert [e.id for e in again.events] == [event.id]  # the event is stored
        stored.append(again.state)
    await adk_own.close()
    assert isinstance(stored[1]["fn"], str)
    assert stored[1] == stored[0]


async def test_appending_to_a_deleted_session_is_session_not_found(ledger: Ledger) -> None:
    service = LedgerSessionService(ledger=ledger)
    session = await service.create_session(app_name=APP, user_id=USER, session_id="gone")
    await service.append_event(session, user_event("one", 1000.0))
    await service.delete_session(app_name=APP, user_id=USER, session_id="gone")
    with pytest.raises(SessionNotFoundError):
        await service.append_event(session, user_event("two", 1001.0))
    # a Session object this service never handed out, too
    stranger = AdkSession(id="gone", app_name=APP, user_id=USER)
    with pytest.raises(SessionNotFoundError):
        await LedgerSessionService(ledger=ledger).append_event(stranger, user_event("x", 1.0))


async def test_fork_session_goes_on_apart_from_its_source(ledger: Ledger) -> None:
    """ADK #4010's fork: the events and state so far, then two sessions on their own."""
    service = LedgerSessionService(ledger=ledger)
    source = await service.create_session(
        app_name=APP, user_id=USER, session_id="main", state={"k": 0}
    )
    first = user_event("plan the trip", 1000.0, state_delta={"k": 1})
    await service.append_event(source, first)
    fork = await service.fork_session(
        app_name=APP, user_id=USER, session_id="main", new_session_id="alt"
    )
    assert fork.id == "alt" and fork.events == [first] and fork.state == {"k": 1}
    await service.append_event(fork, user_event("go by train", 1001.0, state_delta={"k": 2}))
    source = await service.get_session(app_name=APP, user_id=USER, session_id="main")
    assert source is not None
    await service.append_event(source, user_event("go by plane", 1002.0))
    alt = await service.get_session(app_name=APP, user_id=USER, session_id="alt")
    main = await service.get_session(app_name=APP, user_id=USER, session_id="main")
    assert alt is not None and main is not None
    assert [e.content.parts[0].text for e in alt.events if e.content and e.content.parts] == [
        "plan the trip",
        "go by train",
    ]
    assert [e.content.parts[0].text for e in main.events if e.content and e.content.parts] == [
        "plan the trip",
        "go by plane",
    ]
    assert alt.state == {"k": 2} and main.state == {"k": 1}
    listed = await service.list_sessions(app_name=APP, user_id=USER)
    assert sorted(s.id for s in listed.sessions) == ["alt", "main"]
    handle = await ledger.session(ledger_session_id(APP, USER, "alt"), create=False)
    assert handle.parent is not None and (await handle.verify()).ok
    with pytest.raises(AlreadyExistsError):
        await service.fork_session(
            app_name=APP, user_id=USER, session_id="main", new_session_id="alt"
        )
    await service.delete_session(app_name=APP, user_id=USER, session_id="main")
    with pytest.raises(SessionNotFoundError):
        await service.fork_session(app_name=APP, user_id=USER, session_id="main")
