"""LedgerSession against the real OpenAI Agents SDK: its Runner, over HTTP, on PostgreSQL."""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import json
from typing import Any, cast

import pytest
from agents import Agent, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled
from agents.exceptions import UserError
from agents.memory.session import Session as SDKSession
from agents.memory.session_settings import SessionSettings
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from openai import AsyncOpenAI

from contextledger import InvalidMessage, Ledger, SessionExists
from contextledger.adapters.openai_agents import ITEMS_KEY, LedgerSession
from tests.fakellm import FakeLLM, ok, running_fake_llm, tool_call

set_tracing_disabled(True)  # nothing leaves the machine
_ids = itertools.count()


@pytest.fixture
def fake_llm() -> Any:
    with running_fake_llm() as fake:
        yield fake


@function_tool
def get_weather(city: str) -> str:
    """The weather in a city."""
    return f"4 C and rain in {city}"


@pytest.mark.slow
async def test_runner_two_turns_with_a_tool_call(pg_ledger: Ledger, fake_llm: FakeLLM) -> None:
    fake_llm.script(
        "agent-model",
        [tool_call("get_weather", {"city": "Oslo"}, call_id="call_w1"), ok("4 C in Oslo.")],
        then=ok("Colder tomorrow."),
    )
    client = AsyncOpenAI(base_url=fake_llm.base_url, api_key="test", max_retries=0)
    agent = Agent(
        name="weather",
        instructions="Answer briefly.",
        model=OpenAIChatCompletionsModel(model="agent-model", openai_client=client),
        tools=[get_weather],
    )
    session = LedgerSession("agents-run", ledger=pg_ledger)
    assert isinstance(session, SDKSession)
    try:
        await _two_turns(agent, session, fake_llm, pg_ledger)
    finally:
        await client.close()


async def _two_turns(
    agent: Agent[Any], session: LedgerSession, fake_llm: FakeLLM, ledger: Ledger
) -> None:

    first = await Runner.run(agent, "Weather in Oslo?", session=session)
    assert first.final_output == "4 C in Oslo."
    second = await Runner.run(agent, "And tomorrow?", session=session)
    assert second.final_output == "Colder tomorrow."

    calls = fake_llm.calls("agent-model")
    assert len(calls) == 3
    sent = calls[2].messages  # the second turn's request carries the whole first turn
    assert [m["role"] for m in sent] == ["system", "user", "assistant", "tool", "assistant", "user"]
    assert sent[1]["content"] == "Weather in Oslo?"
    assert sent[2]["tool_calls"][0]["id"] == "call_w1"
    assert json.loads(sent[2]["tool_calls"][0]["function"]["arguments"]) == {"city": "Oslo"}
    assert sent[3] == {"role": "tool", "tool_call_id": "call_w1", "content": "4 C and rain in Oslo"}
    assert sent[4]["content"] == "4 C in Oslo."
    assert sent[5]["content"] == "And tomorrow?"

    items = await session.get_items()
    assert [i.get("type", "message") for i in items] == [
        "message",
        "function_call",
        "function_call_output",
        "message",
        "message",
        "message",
    ]
    ledger_session = await session.session()
    assert (await ledger_session.verify()).ok
    # a fresh adapter on the same ledger sees the same history
    assert await LedgerSession("agents-run", ledger=ledger).get_items() == items


_text = st.text(alphabet=st.characters(codec="utf-8", exclude_characters="\x00"), max_size=12)
_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**12), 10**12) | _text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_text, inner, max_size=3),
    max_leaves=6,
)
_extra = st.dictionaries(
    st.sampled_from(["id", "status", "x_meta", "annotations"]), _json, max_size=2
)
_call_ids = st.sampled_from(["c1", "c2", "c3"])


def _with(extra: dict[str, Any], item: dict[str, Any]) -> dict[str, Any]:
    return {**extra, **item}


_item = st.one_of(
    st.builds(
        lambda e, r, c: _with(e, {"role": r, "content": c}),
        _extra,
        st.sampled_from(["user", "system", "developer", "assistant"]),
        _text,
    ),
    st.builds(
        lambda e, r, t: _with(
            e, {"type": "message", "role": r, "content": [{"type": "input_text", "text": t}]}
        ),
        _extra,
        st.sampled_from(["user", "assistant"]),
        _text,
    ),
    st.builds(
        lambda e, t: _with(
            e,
            {
                "type": "message",
                "role": "user",
                "content": [
                    {
                        "type": "input_image",
                        "image_url": "data:image/png;base64,iVBORw0KGgo=",
                        "detail": "auto",
                    },
                    {"type": "input_text", "text": t},
                ],
            },
        ),
        _extra,
        _text,
    ),
    st.builds(
        lambda e, c, n, a: _with(
            e, {"type": "function_call", "call_id": c, "name": n, "arguments": json.dumps(a)}
        ),
        _extra,
        _call_ids,
        st.sampled_from(["f", "g"]),
        _json,
    ),
    st.builds(
        lambda e, c, o: _with(e, {"type": "function_call_output", "call_id": c, "output": o}),
        _extra,
        _call_ids,
        _text | st.just([{"type": "input_text", "text": "out"}]),
    ),
    st.builds(
        lambda e, t, enc: _with(
            e,
            {
                "type": "reasoning",
                "summary": [{"type": "summary_text", "text": t}],
                "encrypted_content": enc,
            },
        ),
        _extra,
        _text,
        _text,
    ),
    st.builds(  # a call/output pair of a kind this code does not know by name
        lambda e, c, a: _with(e, {"type": "computer_call", "call_id": c, "action": a}),
        _extra,
        _call_ids,
        _json,
    ),
    st.builds(
        lambda e, c, o: _with(e, {"type": "computer_call_output", "call_id": c, "output": o}),
        _extra,
        _call_ids,
        _json,
    ),
    st.builds(  # an item type nobody has invented yet
        lambda e, t, p: _with(e, {"type": t, "payload": p}),
        _extra,
        st.sampled_from(["web_search_call", "future_item", "item_reference"]),
        _json,
    ),
)


def _answered(batch: list[dict[str, Any]], n: int) -> list[dict[str, Any]]:
    """The batch as the Responses API has it: unique call ids, and a run of calls
    answered right after it (an unanswered call followed by more history gets a
    synthetic output: tested separately)."""
    out: list[dict[str, Any]] = []
    open_calls: list[dict[str, Any]] = []
    for k, item in enumerate(batch):
        if item.get("type") in ("function_call", "computer_call"):
            item = {**item, "call_id": f"{item['call_id']}-{n}-{k}"}
            open_calls.append(item)
        out.append(item)
        rest = [i for i in batch[k + 1 :] if i.get("type") != "reasoning"]
        if open_calls and not (rest and rest[0].get("type") in ("function_call", "computer_call")):
            out += [
                {"type": f"{c['type']}_output", "call_id": c["call_id"], "output": "ok"}
                for c in open_calls
            ]
            open_calls = []
    return out


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(batches=st.lists(st.lists(_item, min_size=1, max_size=5), min_size=1, max_size=4))
async def test_items_round_trip_losslessly(ledger: Ledger, batches: list[list[Any]]) -> None:
    session = LedgerSession(f"oa-prop-{next(_ids)}", ledger=ledger)
    added: list[Any] = []
    for n, generated in enumerate(batches):
        batch = _answered(generated, n)
        await session.add_items(batch)
        added += batch
    assert await session.get_items() == added
    assert await session.get_items(limit=2) == added[-2:]
    popped = await session.pop_item()
    assert popped == added[-1]
    assert await session.get_items() == added[:-1]
    assert (await (await session.session()).verify()).ok


async def test_pop_is_a_rollback_and_history_stays(ledger: Ledger) -> None:
    session = LedgerSession("oa-pop", ledger=ledger)
    calls = [
        {"type": "function_call", "call_id": "a", "name": "f", "arguments": "{}"},
        {"type": "function_call", "call_id": "b", "name": "g", "arguments": "{}"},
    ]
    await session.add_items([{"role": "user", "content": "go"}, *calls])
    assert await session.pop_item() == calls[1]
    assert await session.get_items() == [{"role": "user", "content": "go"}, calls[0]]
    inner = await session.session()
    events = [e async for e in inner.events()]
    # one event (so a concurrent pop cannot land between two): the view without the
    # popped call, the rest of its group kept
    assert [e.type for e in events[-1:]] == ["messages.replaced"]
    # the popped call is still in the ledger
    stored = [getattr(e.payload, "message", {}) for e in events]
    assert any(calls[1] in m.get(ITEMS_KEY, []) for m in stored)
    assert await session.pop_item() == calls[0]
    assert await session.pop_item() == {"role": "user", "content": "go"}
    assert await session.pop_item() is None
    await session.add_items([{"role": "user", "content": "again"}])
    await session.clear_session()
    assert await session.get_items() == []
    assert (await inner.verify()).ok


async def test_fork_branches_from_a_turn_and_both_go_on(ledger: Ledger) -> None:
    """The SDK's branching (``create_branch_from_turn``) as a ledger fork: the branch
    starts with the items up to the mark, the original keeps its later items, and each
    goes on apart; a taken id is ``SessionExists`` (a conflict, not bad input: as the
    adapter's other ledger errors, it propagates as is) and writes nothing."""
    session = LedgerSession("oa-fork", ledger=ledger, session_settings={"limit": 10})
    await session.add_items([{"role": "user", "content": "first question"}])
    await session.add_items([{"role": "assistant", "content": "first answer"}])
    mark = await (await session.session()).checkpoint("after-first")
    await session.add_items([{"role": "user", "content": "second question"}])

    branch = await session.fork("oa-fork-b", at=mark)
    assert isinstance(branch, LedgerSession) and branch.session_settings == SessionSettings(
        limit=10
    )
    first = [{"role": "user", "content": "first question"}]
    first.append({"role": "assistant", "content": "first answer"})
    assert await branch.get_items() == first
    await branch.add_items([{"role": "user", "content": "other question"}])
    assert (await branch.get_items())[-1] == {"role": "user", "content": "other question"}
    assert (await session.get_items())[-1] == {"role": "user", "content": "second question"}
    assert (await branch.session()).parent == ("oa-fork", mark.seq)
    with pytest.raises(SessionExists):
        await session.fork("oa-fork-b")
    with pytest.raises(UserError, match="session_id"):
        await session.fork("")  # bad input: the SDK's UserError
    assert await branch.get_items() == [*first, {"role": "user", "content": "other question"}]


async def test_token_budget_fits_without_splitting_calls(ledger: Ledger) -> None:
    session = LedgerSession("oa-budget", ledger=ledger, token_budget=600, model="gpt-4o")
    for n in range(40):
        await session.add_items(
            [
                {"role": "user", "content": f"question {n} " + "words " * 30},
                {"type": "function_call", "call_id": f"c{n}", "name": "look", "arguments": "{}"},
                {"type": "function_call_output", "call_id": f"c{n}", "output": "found " * 20},
                {
                    "type": "message",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": f"answer {n}"}],
                },
            ]
        )
    items = await session.get_items()
    everything = await LedgerSession("oa-budget", ledger=ledger).get_items()
    assert len(everything) == 160
    assert 0 < len(items) < 160
    assert items[-1] == everything[-1]  # the latest turn is always there
    calls = {i["call_id"] for i in items if i.get("type") == "function_call"}
    outputs = {i["call_id"] for i in items if i.get("type") == "function_call_output"}
    assert calls == outputs  # no call without its output, no output without its call


async def test_an_unanswered_call_gets_a_recorded_synthetic_output(ledger: Ledger) -> None:
    session = LedgerSession("oa-open", ledger=ledger)
    call = {"type": "function_call", "call_id": "lost", "name": "f", "arguments": "{}"}
    await session.add_items([{"role": "user", "content": "go"}, call])
    assert (await session.get_items())[-1] == call  # work in progress: left as is
    await session.add_items([{"role": "user", "content": "never mind"}])
    items = await session.get_items()
    assert items[1:] == [
        call,
        {
            "type": "function_call_output",
            "call_id": "lost",
            "output": "[no result: call was not answered]",
        },
        {"role": "user", "content": "never mind"},
    ]


async def test_bad_items_are_user_errors_and_write_nothing(ledger: Ledger) -> None:
    session = LedgerSession("oa-bad", ledger=ledger)
    await session.add_items([{"role": "user", "content": "ok"}])
    head = (await session.session()).head
    for bad in (
        [{"role": "user", "content": "fine"}, {"no": "type"}],
        [{"role": "robot", "content": "x"}],
        [{"role": "user", "content": "nul \x00"}],
        "not a list",
    ):
        with pytest.raises(UserError) as info:
            await session.add_items(bad)  # type: ignore[arg-type]
        assert isinstance(info.value.__cause__, InvalidMessage | Exception)
    assert (await session.session()).head == head
    assert await session.get_items() == [{"role": "user", "content": "ok"}]
    with pytest.raises(UserError):
        LedgerSession("x")
    with pytest.raises(UserError):
        LedgerSession("x", ledger=ledger, token_budget=0)


async def test_dsn_construction_opens_and_closes_its_ledger(pg_dsn: str) -> None:
    session = LedgerSession("oa-dsn", dsn=pg_dsn)
    await session.add_items([{"role": "user", "content": "persisted"}])
    await session.close()
    again = LedgerSession("oa-dsn", dsn=pg_dsn)
    assert await again.get_items() == [{"role": "user", "content": "persisted"}]
    await again.close()


async def test_moves_in_and_out_of_the_sdk_own_store(pg_ledger: Ledger, pg_dsn: str) -> None:
    from agents.extensions.memory import SQLAlchemySession

    url = pg_dsn.replace("postgresql://", "postgresql+asyncpg://", 1)
    items: list[Any] = [
        {"role": "user", "content": "Weather in Oslo?"},
        {"type": "function_call", "call_id": "c1", "name": "w", "arguments": '{"city":"Oslo"}'},
        {"type": "function_call_output", "call_id": "c1", "output": "4 C"},
        {"type": "message", "role": "assistant", "id": "m1", "status": "completed",
         "content": [{"type": "output_text", "text": "4 C.", "annotations": []}]},
    ]  # fmt: skip
    theirs = SQLAlchemySession.from_url("move-in", url=url, create_tables=True)
    back = SQLAlchemySession.from_url("move-out", url=url, create_tables=True)
    try:
        await theirs.add_items(items)
        ours = LedgerSession("moved", ledger=pg_ledger)
        await ours.add_items(await theirs.get_items())  # into the ledger
        assert await ours.get_items() == items
        await back.add_items(await ours.get_items())  # and out again
        assert await back.get_items() == items
    finally:
        await theirs._engine.dispose()
        await back._engine.dispose()


# -- drop-in: what the SDK's own stores do (issue 29) ------------------------------------


@pytest.fixture(params=["memory", "postgres"])
def store_dsn(request: pytest.FixtureRequest) -> str:
    """A dsn on each store, for ``LedgerSession(dsn=…)`` (the SDK tests' shape)."""
    if request.param == "memory":
        return "memory://"
    dsn: str = request.getfixturevalue("pg_dsn")
    return dsn


async def test_dict_session_settings_are_coerced_and_checked(ledger: Ledger) -> None:
    session = LedgerSession("oa-settings", ledger=ledger, session_settings={"limit": 1})
    assert isinstance(session.session_settings, SessionSettings)
    await session.add_items([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])
    assert await session.get_items() == [{"role": "user", "content": "b"}]
    with pytest.raises(TypeError, match="limitt"):
        LedgerSession("oa-settings", ledger=ledger, session_settings={"limitt": 1})


async def test_threads_with_loops_of_their_own_share_one_session(store_dsn: str) -> None:
    """Each thread runs its own event loop, as ``Runner.run_sync`` does; the test's loop
    is blocked meanwhile (as the SDK's concurrency test blocks it)."""
    session = LedgerSession("oa-threads", dsn=store_dsn)
    await session.add_items([{"role": "user", "content": "first"}])

    def add(n: int) -> None:
        asyncio.run(session.add_items([{"role": "user", "content": f"m{n}"}]))

    with concurrent.futures.ThreadPoolExecutor(max_workers=5) as pool:
        list(pool.map(add, range(10)))
    contents = {i.get("content") for i in await session.get_items()}
    assert contents == {"first", *(f"m{n}" for n in range(10))}
    session.close()  # plainly, as the SDK's tests close its stores


async def test_ledger_given_is_used_from_other_loops(ledger: Ledger) -> None:
    session = LedgerSession("oa-foreign", ledger=ledger)
    await session.add_items([{"role": "user", "content": "home"}])
    # from a fresh thread's loop while this loop keeps running (awaiting the thread)
    await asyncio.to_thread(
        lambda: asyncio.run(session.add_items([{"role": "user", "content": "away"}]))
    )
    assert [i.get("content") for i in await session.get_items()] == ["home", "away"]
    items = await asyncio.to_thread(lambda: asyncio.run(session.get_items()))
    assert [i.get("content") for i in items] == ["home", "away"]
    await session.close()


@pytest.mark.slow
async def test_run_sync_in_a_fresh_thread(store_dsn: str, fake_llm: FakeLLM) -> None:
    fake_llm.script("agent-model", [ok("One.")], then=ok("Two."))
    session = LedgerSession("oa-run-sync", dsn=store_dsn)

    def turn(text: str) -> Any:
        client = AsyncOpenAI(base_url=fake_llm.base_url, api_key="test", max_retries=0)
        agent = Agent(
            name="a",
            instructions="Be terse.",
            model=OpenAIChatCompletionsModel(model="agent-model", openai_client=client),
        )
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        try:
            return Runner.run_sync(agent, text, session=session).final_output
        finally:
            loop.close()

    assert await asyncio.to_thread(turn, "first") == "One."
    assert await asyncio.to_thread(turn, "second") == "Two."
    second = fake_llm.calls("agent-model")[1].messages
    assert [m["content"] for m in second if m["role"] == "user"] == ["first", "second"]
    items = await session.get_items()
    assert [i.get("content") for i in items if i.get("role") == "user"] == ["first", "second"]
    await session.close()


async def test_concurrent_pops_pop_each_item_once(ledger: Ledger) -> None:
    session = LedgerSession("oa-pops", ledger=ledger)
    other = LedgerSession("oa-pops", ledger=ledger)  # a second handle on the same session
    items = [{"role": "user", "content": f"m{n}"} for n in range(10)]
    await session.add_items(cast(Any, items))
    popped = await asyncio.gather(*(s.pop_item() for s in [session, other] * 5))
    assert sorted(str(p["content"]) for p in popped if p is not None) == sorted(
        str(i["content"]) for i in items
    )
    assert await session.get_items() == []
    assert await session.pop_item() is None


def test_close_from_sync_code_and_reopen(pg_dsn: str) -> None:
    session = LedgerSession("oa-sync-close", dsn=pg_dsn)
    asyncio.run(session.add_items([{"role": "user", "content": "kept"}]))
    session.close()
    session.close()  # twice is fine
    assert asyncio.run(session.get_items()) == [{"role": "user", "content": "kept"}]
    session.close()


async def test_a_memory_ledger_used_from_threads_with_short_loops_never_hangs() -> None:
    """A ``memory://`` ledger passed as ``ledger=`` and first used from a thread: its home
    is that thread's loop, which ends when its ``asyncio.run`` does. A call another thread
    had handed to it then waited forever (4 of 10 in a run); now it runs again where it
    is, whose loop becomes home."""
    import threading

    async with Ledger.open("memory://") as ledger:
        session = LedgerSession("oa-short-loops", ledger=ledger)
        start = threading.Barrier(10)
        errors: list[BaseException] = []

        def add(n: int) -> None:
            start.wait()
            try:
                asyncio.run(session.add_items([{"role": "user", "content": f"m{n}"}]))
            except BaseException as exc:  # reported below, not lost in the thread
                errors.append(exc)

        threads = [threading.Thread(target=add, args=(n,), daemon=True) for n in range(10)]
        for t in threads:
            t.start()
        for t in threads:
            await asyncio.to_thread(t.join, 30)
        assert not [t for t in threads if t.is_alive()]  # none left waiting
        assert all(isinstance(e, UserError) for e in errors), errors  # a loop not running: typed
        contents = [
            i.get("content")
            for i in await asyncio.to_thread(lambda: asyncio.run(session.get_items()))
        ]
        assert set(contents) <= {f"m{n}" for n in range(10)}
        assert len(contents) == len(set(contents)) == 10 - len(errors)
