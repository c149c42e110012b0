"""LedgerChatMessageHistory and LedgerAgentMemory against real langchain-core / langgraph."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from langchain_core.messages import (
    AIMessage,
    AnyMessage,
    BaseMessage,
    ChatMessage,
    FunctionMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)
from langgraph.graph import END, START, MessagesState, StateGraph

from contextledger import InvalidArgument, Ledger, SessionExists, SessionNotFound
from contextledger.adapters.langchain import (
    InvalidLangChainMessage,
    LedgerAgentMemory,
    LedgerChatMessageHistory,
)
from tests.fakellm import FakeLLM, ok, tool_call

_ids = iter(range(10**9))


# -- lossless round trip ---------------------------------------------------------------

_text = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=16)
_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | _text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_text, inner, max_size=3),
    max_leaves=6,
)
_kwargs = st.dictionaries(st.from_regex(r"[a-z_]{1,6}", fullmatch=True), _json, max_size=2)
_content = st.one_of(
    _text,
    st.lists(
        st.one_of(
            _text,
            st.builds(lambda t: {"type": "text", "text": t}, _text),
            st.builds(
                lambda u: {"type": "image_url", "image_url": {"url": u}},
                st.just("data:image/png;base64,iVBORw0KGgo="),
            ),
        ),
        max_size=3,
    ),
)
_id = st.none() | st.from_regex(r"[a-z0-9-]{1,10}", fullmatch=True)
_call = st.builds(
    lambda n, a, i: {"name": n, "args": a, "id": i, "type": "tool_call"},
    st.from_regex(r"[a-z_]{1,8}", fullmatch=True),
    st.dictionaries(_text, _json, max_size=2),
    st.from_regex(r"call_[a-z0-9]{1,6}", fullmatch=True),
)
_usage = st.none() | st.builds(
    lambda i, o: {"input_tokens": i, "output_tokens": o, "total_tokens": i + o},
    st.integers(0, 10**6),
    st.integers(0, 10**6),
)
_message = st.one_of(
    st.builds(HumanMessage, content=_content, additional_kwargs=_kwargs, id=_id),
    st.builds(
        AIMessage,
        content=_content,
        tool_calls=st.lists(_call, max_size=2),
        additional_kwargs=_kwargs,
        response_metadata=_kwargs,
        usage_metadata=_usage,
        id=_id,
        name=st.none() | st.just("agent"),
    ),
    st.builds(
        ToolMessage,
        content=_content,
        tool_call_id=st.from_regex(r"call_[a-z0-9]{1,6}", fullmatch=True),
        status=st.sampled_from(["success", "error"]),
        artifact=_json,
        id=_id,
    ),
    st.builds(SystemMessage, content=_content, id=_id),
    st.builds(ChatMessage, content=_content, role=st.sampled_from(["critic", "user", "tool"])),
    st.builds(FunctionMessage, content=_text, name=st.from_regex(r"[a-z]{1,6}", fullmatch=True)),
)


@settings(
    max_examples=50,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(batches=st.lists(st.lists(_message, min_size=1, max_size=4), min_size=1, max_size=3))
async def test_every_message_type_round_trips_losslessly(
    ledger: Ledger, batches: list[list[BaseMessage]]
) -> None:
    history = LedgerChatMessageHistory(f"lc-prop-{next(_ids)}", ledger=ledger)
    for batch in batches:
        await history.aadd_messages(batch)
    assert await history.aget_messages() == [m for b in batches for m in b]
    assert (await (await history.session()).verify()).ok


# -- the async API -----------------------------------------------------------------------


async def test_async_history_add_clear_budget_and_errors(ledger: Ledger) -> None:
    history = LedgerChatMessageHistory("chat-1", ledger=ledger, model="gpt-4o")
    await history.aadd_messages([SystemMessage("Be terse."), HumanMessage("Hi, I'm Ada.")])
    await history.aadd_messages([AIMessage("Hello Ada.")])
    assert [m.content for m in await history.aget_messages()] == [
        "Be terse.",
        "Hi, I'm Ada.",
        "Hello Ada.",
    ]
    # the same session seen from the ledger: chat messages, LangChain's kept beside
    session = await ledger.session("chat-1", create=False)
    assert [(m["role"], m["content"]) for m in await session.view()] == [
        ("system", "Be terse."),
        ("user", "Hi, I'm Ada."),
        ("assistant", "Hello Ada."),
    ]
    for i in range(30):
        await history.aadd_messages([HumanMessage(f"question {i} " + "word " * 40)])
    fitted = await history.aget_messages(token_budget=400)
    assert 0 < len(fitted) < 33
    assert fitted[-1].content == "question 29 " + "word " * 40
    assert all(isinstance(m, BaseMessage) for m in fitted)

    head = (await ledger.session("chat-1", create=False)).head
    with pytest.raises(InvalidLangChainMessage) as bad:
        await history.aadd_messages(
            [HumanMessage("ok"), AIMessage("x", additional_kwargs={"o": object()})]
        )
    assert isinstance(bad.value, ValueError) and bad.value.code == "INVALID_MESSAGE"
    with pytest.raises(ValueError):
        await history.aadd_messages(["not a message"])  # type: ignore[list-item]
    with pytest.raises(ValueError):
        await history.aadd_messages(HumanMessage("not a list"))  # type: ignore[arg-type]
    assert (await ledger.session("chat-1", create=False)).head == head  # nothing written

    await history.aclear()
    assert await history.aget_messages() == []
    await history.aadd_messages([HumanMessage("after clear")])
    assert [m.content for m in await history.aget_messages()] == ["after clear"]
    assert (await ledger.verify("chat-1")).ok  # the cleared turns are still in the ledger


async def test_sync_api_works_inside_a_running_loop(ledger: Ledger) -> None:
    """As with ``InMemoryChatMessageHistory``: sync calls from async code (the loop waits)."""
    history = LedgerChatMessageHistory("chat-sync", ledger=ledger)
    history.add_user_message("from sync")
    await history.aadd_messages([AIMessage("from async")])
    assert [m.content for m in history.messages] == ["from sync", "from async"]
    assert [m.content for m in await history.aget_messages()] == ["from sync", "from async"]
    history.clear()
    assert history.messages == []
    assert await history.aget_messages() == []
    history.close()


def test_sync_api_from_plain_sync_code(pg_dsn: str) -> None:
    history = LedgerChatMessageHistory("chat-plain", dsn=pg_dsn)
    try:
        history.add_user_message("Hi from sync code")
        history.add_ai_message(
            AIMessage("Hello", tool_calls=[{"name": "f", "args": {}, "id": "c"}])
        )
        history.add_messages([ToolMessage("42", tool_call_id="c")])
        assert [type(m).__name__ for m in history.messages] == [
            "HumanMessage",
            "AIMessage",
            "ToolMessage",
        ]
        history.clear()
        assert history.messages == []
    finally:
        history.close()

    async def read() -> list[BaseMessage]:  # the same rows, seen from async code
        reader = LedgerChatMessageHistory("chat-plain", dsn=pg_dsn)
        try:
            await reader.aadd_messages([HumanMessage("async")])
            return await reader.aget_messages()
        finally:
            await reader.aclose()

    assert [m.content for m in asyncio.run(read())] == ["async"]


def test_dsn_history_from_one_event_loop_after_another(pg_dsn: str) -> None:
    """Each ``asyncio.run`` is a new loop; the history's pool must not belong to the first
    (LangChain's own tests run each test on a loop of its own)."""
    history = LedgerChatMessageHistory("chat-loops", dsn=pg_dsn)
    memory = LedgerAgentMemory(dsn=pg_dsn)
    try:
        asyncio.run(history.aadd_messages([HumanMessage("first loop")]))
        asyncio.run(history.aadd_messages([AIMessage("second loop")]))
        history.add_messages([HumanMessage("sync")])
        got = asyncio.run(history.aget_messages())
        assert [m.content for m in got] == ["first loop", "second loop", "sync"]
        asyncio.run(memory.history("t").aadd_messages([HumanMessage("a")]))
        asyncio.run(
            memory.pre_model_hook.ainvoke(
                {"messages": [HumanMessage("b")]}, {"configurable": {"thread_id": "t"}}
            )
        )
        assert [m.content for m in memory.history("t").messages] == ["a", "b"]
    finally:
        history.close()
        memory.close()


def test_dsn_history_never_blocks_the_callers_loop(pg_dsn: str) -> None:
    """Opening a pool reads files (asyncpg's passfile lookup stats ~/.pgpass): with
    ``dsn=`` that happens on the adapter's own loop thread, never on the caller's loop
    (LangChain's tests fail any blocking call there, with blockbuster)."""
    blocking = {os.stat, os.lstat, os.path.exists, open}
    seen: list[str] = []

    def watch(frame: Any, event: str, arg: Any) -> None:
        if event == "c_call" and arg in blocking:
            seen.append(arg.__name__)

    async def main() -> list[str]:
        history = LedgerChatMessageHistory("chat-blocking", dsn=pg_dsn)
        sys.setprofile(watch)  # this thread only: the caller's loop
        try:
            await history.aadd_messages([HumanMessage("hi")])
            return [str(m.content) for m in await history.aget_messages()]
        finally:
            sys.setprofile(None)
            await history.aclose()

    assert asyncio.run(main()) == ["hi"]
    assert seen == []


class _HookState(MessagesState):
    llm_input_messages: list[AnyMessage]


def test_agent_memory_hooks_in_a_sync_graph(pg_dsn: str) -> None:
    from langgraph.graph import MessagesState

    class S(MessagesState):
        llm_input_messages: list[AnyMessage]

    seen: list[int] = []

    def model(state: dict[str, Any]) -> dict[str, Any]:
        seen.append(len(state["llm_input_messages"]))
        return {"messages": [AIMessage(f"answer {len(seen)}")]}

    memory = LedgerAgentMemory(dsn=pg_dsn, model="gpt-4o")
    graph = (
        StateGraph(_HookState)
        .add_node("pre", memory.pre_model_hook)
        .add_node("model", model)
        .add_node("post", memory.post_model_hook)
        .add_edge(START, "pre")
        .add_edge("pre", "model")
        .add_edge("model", "post")
        .add_edge("post", END)
        .compile()
    )
    try:
        for q in ("one", "two", "three"):
            graph.invoke({"messages": [HumanMessage(q)]}, {"configurable": {"thread_id": "s"}})
        assert seen == [1, 3, 5]  # each run saw the whole thread, from the ledger
        assert [m.content for m in memory.history("s").messages] == [
            "one",
            "answer 1",
            "two",
            "answer 2",
            "three",
            "answer 3",
        ]
    finally:
        memory.close()


@pytest.mark.filterwarnings("ignore:RunnableWithMessageHistory is deprecated")
def test_sync_api_on_memory_and_runnable_with_message_history() -> None:
    from langchain_core.runnables import RunnableLambda
    from langchain_core.runnables.history import RunnableWithMessageHistory

    histories: dict[str, LedgerChatMessageHistory] = {}

    def history_for(session_id: str) -> LedgerChatMessageHistory:
        if session_id not in histories:
            histories[session_id] = LedgerChatMessageHistory(session_id, dsn="memory://")
        return histories[session_id]

    def model(messages: list[BaseMessage]) -> AIMessage:
        return AIMessage(f"seen {len(messages)}")

    chain = RunnableWithMessageHistory(RunnableLambda(model), history_for)
    config: Any = {"configurable": {"session_id": "rwmh"}}
    assert chain.invoke([HumanMessage("one")], config).content == "seen 1"
    assert chain.invoke([HumanMessage("two")], config).content == "seen 3"

    async def from_async() -> str:
        reply = await chain.ainvoke([HumanMessage("three")], config)
        return str(reply.content)

    assert asyncio.run(from_async()) == "seen 5"
    assert [m.content for m in histories["rwmh"].messages] == [
        "one",
        "seen 1",
        "two",
        "seen 3",
        "three",
        "seen 5",
    ]
    histories["rwmh"].close()
    with pytest.raises(InvalidArgument):
        LedgerChatMessageHistory("m")
    with pytest.raises(InvalidArgument):
        LedgerChatMessageHistory("", dsn="memory://")


# -- LangGraph -------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:create_react_agent has been moved")
async def test_react_agent_remembers_across_runs_and_fits_the_budget(
    pg_ledger: Ledger, fake_llm: FakeLLM
) -> None:
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI
    from langgraph.prebuilt import create_react_agent

    @tool
    def weather(city: str) -> str:
        """The weather in a city."""
        return f"4 C in {city}"

    fake_llm.script(
        "x",
        [
            tool_call("weather", {"city": "Oslo"}, call_id="call_w"),
            ok("It is 4 C in Oslo."),
            ok("You asked about Oslo."),
        ],
    )
    model = ChatOpenAI(model="x", base_url=fake_llm.base_url, api_key="test", max_retries=0)
    memory = LedgerAgentMemory(ledger=pg_ledger, model="gpt-4o")
    agent = create_react_agent(
        model,
        [weather],
        pre_model_hook=memory.pre_model_hook,
        post_model_hook=memory.post_model_hook,
    )
    config: Any = {"configurable": {"thread_id": "t1"}}
    await agent.ainvoke({"messages": [HumanMessage("Weather in Oslo?")]}, config)
    out = await agent.ainvoke({"messages": [HumanMessage("What did I ask?")]}, config)
    assert out["messages"][-1].content == "You asked about Oslo."
    last = fake_llm.requests[-1]
    assert [m["role"] for m in last.messages] == [
        "user",
        "assistant",
        "tool",
        "assistant",
        "user",
    ]
    assert "Weather in Oslo?" in last.text and "4 C in Oslo" in last.text

    stored = await memory.history("t1").aget_messages()
    assert [type(m).__name__ for m in stored] == [
        "HumanMessage",
        "AIMessage",
        "ToolMessage",
        "AIMessage",
        "HumanMessage",
        "AIMessage",
    ]
    assert stored[1].tool_calls[0]["id"] == "call_w"  # type: ignore[attr-defined]
    # a re-run over the same state records nothing twice (idempotency keys)
    session = await memory.history("t1").session()
    head = session.head
    await memory.pre_model_hook.ainvoke({"messages": out["messages"]}, config)
    await session.refresh()
    assert session.head == head

    # a small budget: the model sees only the recent part of a long thread
    fake_llm.script("x", [ok("fine")])
    tight = LedgerAgentMemory(ledger=pg_ledger, model="gpt-4o", token_budget=300)
    agent2 = create_react_agent(
        model, [weather], pre_model_hook=tight.pre_model_hook, post_model_hook=tight.post_model_hook
    )
    await tight.history("t2").aadd_messages(
        [HumanMessage(f"old {i} " + "filler " * 30) for i in range(40)]
    )
    await agent2.ainvoke(
        {"messages": [HumanMessage("newest question")]}, {"configurable": {"thread_id": "t2"}}
    )
    sent = fake_llm.requests[-1]
    assert sent.messages[-1]["content"] == "newest question"
    assert "old 0 " not in sent.text and len(sent.messages) < 41
    with pytest.raises(InvalidArgument, match="thread_id"):
        await agent2.ainvoke({"messages": [HumanMessage("no thread")]})


@pytest.mark.filterwarnings("ignore:create_react_agent has been moved")
async def test_react_agent_continues_a_forked_thread(pg_ledger: Ledger, fake_llm: FakeLLM) -> None:
    """Time travel for the memory: a thread forked at its first answer continues from
    there under a new thread id; the model sees the prefix, not the original's later
    turns, and the original thread is unaffected."""
    from langchain_openai import ChatOpenAI
    from langgraph.prebuilt import create_react_agent

    fake_llm.script(
        "y", [ok("Oslo it is."), ok("Bergen then."), ok("Trondheim instead."), ok("still")]
    )
    model = ChatOpenAI(model="y", base_url=fake_llm.base_url, api_key="test", max_retries=0)
    memory = LedgerAgentMemory(ledger=pg_ledger, model="gpt-4o")
    agent = create_react_agent(
        model, [], pre_model_hook=memory.pre_model_hook, post_model_hook=memory.post_model_hook
    )
    main: Any = {"configurable": {"thread_id": "trip"}}
    await agent.ainvoke({"messages": [HumanMessage("Plan a trip to Oslo")]}, main)
    session = await memory.history("trip").session()
    mark = await session.checkpoint("after-oslo")
    await agent.ainvoke({"messages": [HumanMessage("Add Bergen")]}, main)

    await memory.afork("trip", "trip-b", at=mark)
    branch: Any = {"configurable": {"thread_id": "trip-b"}}
    await agent.ainvoke({"messages": [HumanMessage("Add Trondheim")]}, branch)
    sent = fake_llm.requests[-1]
    assert [m["content"] for m in sent.messages] == [
        "Plan a trip to Oslo",
        "Oslo it is.",
        "Add Trondheim",
    ]
    forked = await memory.history("trip-b").session()
    assert forked.parent == (session.session_id, mark.seq)
    original = [m.content for m in await memory.history("trip").aget_messages()]
    assert original == ["Plan a trip to Oslo", "Oslo it is.", "Add Bergen", "Bergen then."]
    with pytest.raises(SessionExists):
        await memory.afork("trip", "trip-b")  # the id is taken: nothing written


def test_sync_fork_of_a_thread(pg_dsn: str) -> None:
    memory = LedgerAgentMemory(dsn=pg_dsn, model="gpt-4o")
    try:
        memory.history("s").add_messages([HumanMessage("one"), AIMessage("two")])
        memory.fork("s", "s-2", at=2)
        assert [m.content for m in memory.history("s-2").messages] == ["one"]
        assert [m.content for m in memory.history("s").messages] == ["one", "two"]
    finally:
        memory.close()


async def test_forking_a_thread_with_no_memory_is_refused_and_writes_nothing(
    pg_ledger: Ledger,
) -> None:
    """A typo in the source thread is ``SessionNotFound``: not an empty session made
    under it and forked (two sessions no one asked for, removable only by a purge)."""
    memory = LedgerAgentMemory(ledger=pg_ledger, model="gpt-4o")
    with pytest.raises(SessionNotFound):
        await memory.afork("no-such-thread", "copy")
    assert await pg_ledger.sessions() == []


def test_missing_extra_names_the_pip_command() -> None:
    code = """
import sys, importlib.abc
import contextledger
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split('.')[0] in ('langchain_core', 'langgraph'):
            raise ImportError('blocked: ' + name)
sys.meta_path.insert(0, Block())
try:
    import contextledger.adapters.langchain
except contextledger.MissingExtra as exc:
    print(exc.code, exc.details['extra'], str(exc))
"""
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    assert out.startswith("MISSING_EXTRA langchain ")
    assert "pip install 'contextledger-pg[langchain]'" in out


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:RunnableWithMessageHistory is deprecated")
async def test_runnable_with_message_history_over_the_ledger(
    pg_ledger: Ledger, fake_llm: FakeLLM
) -> None:
    from langchain_core.prompts import ChatPromptTemplate, MessagesPlaceholder
    from langchain_core.runnables.history import RunnableWithMessageHistory
    from langchain_openai import ChatOpenAI

    fake_llm.script("x", [ok("Hello Ada."), ok("You are Ada.")])
    prompt = ChatPromptTemplate.from_messages(
        [("system", "Be terse."), MessagesPlaceholder("history"), ("human", "{q}")]
    )
    llm = ChatOpenAI(model="x", base_url=fake_llm.base_url, api_key="test", max_retries=0)
    chain = RunnableWithMessageHistory(
        prompt | llm,
        lambda sid: LedgerChatMessageHistory(sid, ledger=pg_ledger),
        input_messages_key="q",
        history_messages_key="history",
    )
    config: Any = {"configurable": {"session_id": "rwmh"}}
    await chain.ainvoke({"q": "Hi, I'm Ada."}, config)
    answer = await chain.ainvoke({"q": "Who am I?"}, config)
    assert answer.content == "You are Ada."
    assert [m["content"] for m in fake_llm.requests[-1].messages] == [
        "Be terse.",
        "Hi, I'm Ada.",
        "Hello Ada.",
        "Who am I?",
    ]
    stored = await LedgerChatMessageHistory("rwmh", ledger=pg_ledger).aget_messages()
    assert [m.content for m in stored] == [
        "Hi, I'm Ada.",
        "Hello Ada.",
        "Who am I?",
        "You are Ada.",
    ]
