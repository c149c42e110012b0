"""LedgerHistory against real pydantic-ai: an Agent over HTTP, messages round-tripped."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from openai import AsyncOpenAI
from pydantic_ai import Agent
from pydantic_ai.exceptions import UserError
from pydantic_ai.messages import (
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelRequest,
    ModelResponse,
    RetryPromptPart,
    SystemPromptPart,
    TextPart,
    ThinkingPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider

from contextledger import Ledger
from contextledger.adapters.pydantic_ai import LedgerHistory
from tests.fakellm import FakeLLM, ok, running_fake_llm, server_error, tool_call

_ids = itertools.count()


def _json(messages: list[ModelMessage]) -> Any:
    return ModelMessagesTypeAdapter.dump_python(messages, mode="json")


@pytest.fixture
def fake_llm() -> Any:
    with running_fake_llm() as fake:
        yield fake


@pytest.mark.slow
async def test_agent_two_turns_with_a_tool_call(pg_ledger: Ledger, fake_llm: FakeLLM) -> None:
    fake_llm.script(
        "pai-model",
        [tool_call("get_weather", {"city": "Oslo"}, call_id="call_p1"), ok("4 C in Oslo.")],
        then=ok("Colder tomorrow."),
    )
    client = AsyncOpenAI(base_url=fake_llm.base_url, api_key="test", max_retries=0)
    history = LedgerHistory("pai-run", ledger=pg_ledger, token_budget=4000)
    agent = Agent(
        OpenAIChatModel("pai-model", provider=OpenAIProvider(openai_client=client)),
        instructions="Answer briefly.",
        capabilities=[history.capability()],
    )

    @agent.tool_plain
    def get_weather(city: str) -> str:
        """The weather in a city."""
        return f"4 C and rain in {city}"

    try:
        first = await agent.run("Weather in Oslo?", message_history=await history.load())
        assert first.output == "4 C in Oslo."
        await history.save(first.all_messages())
        second = await agent.run("And tomorrow?", message_history=await history.load())
        assert second.output == "Colder tomorrow."
        await history.save(second.all_messages())
    finally:
        await client.close()

    calls = fake_llm.calls("pai-model")
    assert len(calls) == 3
    sent = calls[2].messages
    roles = [m["role"] for m in sent]
    assert roles == ["system", "user", "assistant", "tool", "assistant", "user"]
    assert sent[1]["content"] == "Weather in Oslo?"
    assert sent[2]["tool_calls"][0]["id"] == "call_p1"
    assert sent[3]["content"] == "4 C and rain in Oslo"
    assert sent[4]["content"] == "4 C in Oslo."
    assert sent[5]["content"] == "And tomorrow?"

    stored = await history.load()
    # nothing recorded twice, everything as pydantic-ai's own JSON form has it (a live
    # response's provider_details may hold a datetime, which that form keeps as a string)
    assert _json(stored) == _json(second.all_messages())
    assert (await (await history.session()).verify()).ok


async def test_processor_fits_the_budget_and_keeps_pairs(ledger: Ledger) -> None:
    history = LedgerHistory("pai-budget", ledger=ledger, token_budget=700, model="gpt-4o")
    messages: list[ModelMessage] = []
    for n in range(30):
        messages += [
            ModelRequest(parts=[UserPromptPart(f"question {n} " + "words " * 30)]),
            ModelResponse(parts=[ToolCallPart("look", {"n": n}, f"c{n}")]),
            ModelRequest(parts=[ToolReturnPart("look", "found " * 20, tool_call_id=f"c{n}")]),
            ModelResponse(parts=[TextPart(f"answer {n}")]),
        ]
    messages.append(ModelRequest(parts=[UserPromptPart("the latest question")]))
    fitted = await history.processor(messages)
    assert 0 < len(fitted) < len(messages)
    assert fitted[-1] == messages[-1]
    calls = {p.tool_call_id for m in fitted for p in m.parts if isinstance(p, ToolCallPart)}
    returns = {p.tool_call_id for m in fitted for p in m.parts if isinstance(p, ToolReturnPart)}
    assert calls == returns
    # everything was recorded once; handing the fitted list back records nothing
    assert await history.load() == messages
    assert await history.save(fitted) == 0
    assert await history.save(messages) == 0
    assert len(await history.load()) == len(messages)


_text = st.text(alphabet=st.characters(codec="utf-8", exclude_characters="\x00"), max_size=12)
_when = st.datetimes(
    min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1), timezones=st.just(UTC)
)
_args = st.dictionaries(_text, st.integers(-1000, 1000) | _text, max_size=3)
_request_part = st.one_of(
    st.builds(lambda t, w: SystemPromptPart(t, timestamp=w), _text, _when),
    st.builds(lambda t, w: UserPromptPart(t, timestamp=w), _text, _when),
    st.builds(
        lambda t, c, w: ToolReturnPart("tool", {"value": t}, tool_call_id=c, timestamp=w),
        _text,
        st.sampled_from(["a", "b"]),
        _when,
    ),
    st.builds(lambda t, w: RetryPromptPart(t, timestamp=w), _text, _when),
    st.builds(
        lambda t, w: RetryPromptPart(t, tool_name="tool", tool_call_id="a", timestamp=w),
        _text,
        _when,
    ),
)
_response_part = st.one_of(
    st.builds(TextPart, _text),
    st.builds(ThinkingPart, _text),
    st.builds(lambda a, c: ToolCallPart("tool", a, c), _args, st.sampled_from(["a", "b"])),
)
_message = st.one_of(
    st.builds(
        lambda parts, w: ModelRequest(parts=parts, timestamp=w),
        st.lists(_request_part, min_size=1, max_size=3),
        _when,
    ),
    st.builds(
        lambda parts, w, name: ModelResponse(parts=parts, timestamp=w, model_name=name),
        st.lists(_response_part, min_size=1, max_size=3),
        _when,
        st.none() | _text,
    ),
)


def _answered(batch: list[ModelMessage], n: int) -> list[ModelMessage]:
    """As pydantic-ai runs go: unique call ids, each response's calls answered by the
    next request (an unanswered call followed by more history gets a synthetic result)."""
    out: list[ModelMessage] = []
    for k, message in enumerate(batch):
        if isinstance(message, ModelResponse):
            parts = [
                ToolCallPart(p.tool_name, p.args, f"{p.tool_call_id}-{n}-{k}-{j}")
                if isinstance(p, ToolCallPart)
                else p
                for j, p in enumerate(message.parts)
            ]
            message = ModelResponse(
                parts=parts, timestamp=message.timestamp, model_name=message.model_name
            )
            out.append(message)
            ids = [p.tool_call_id for p in parts if isinstance(p, ToolCallPart)]
            if ids:
                out.append(
                    ModelRequest(
                        parts=[ToolReturnPart("tool", "done", tool_call_id=i) for i in ids]
                    )
                )
        else:
            out.append(message)
    return out


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(batches=st.lists(st.lists(_message, max_size=4), min_size=1, max_size=3))
async def test_messages_round_trip_losslessly(
    ledger: Ledger, batches: list[list[ModelMessage]]
) -> None:
    history = LedgerHistory(f"pai-prop-{next(_ids)}", ledger=ledger)
    saved: list[ModelMessage] = []
    for n, generated in enumerate(batches):
        batch = _answered(generated, n)
        await history.save(batch)
        # a message is recorded once: one equal (in pydantic-ai's JSON form) is not new
        for m in batch:
            if _json([m])[0] not in _json(saved):
                saved.append(m)
    loaded = await history.load()
    assert loaded == saved
    assert _json(loaded) == _json(saved)
    again = LedgerHistory(history.session_id, ledger=ledger)  # a new process, same ledger
    assert await again.load() == saved
    assert await again.save(saved) == 0


async def test_bad_input_is_a_user_error_and_writes_nothing(ledger: Ledger) -> None:
    history = LedgerHistory("pai-bad", ledger=ledger)
    await history.save([ModelRequest(parts=[UserPromptPart("ok")])])
    head = (await history.session()).head
    with pytest.raises(UserError):
        await history.save([{"role": "user", "content": "a dict"}])  # type: ignore[list-item]
    with pytest.raises(UserError) as info:
        await history.save([ModelRequest(parts=[UserPromptPart("nul \x00")])])
    assert info.value.__cause__ is not None
    assert (await history.session()).head == head
    with pytest.raises(UserError):
        LedgerHistory("x")


async def test_dsn_construction(pg_dsn: str) -> None:
    history = LedgerHistory("pai-dsn", dsn=pg_dsn)
    message = ModelRequest(parts=[UserPromptPart("kept")])
    await history.save([message])
    await history.close()
    again = LedgerHistory("pai-dsn", dsn=pg_dsn)
    assert await again.load() == [message]
    await again.close()


async def test_moves_in_and_out_of_pydantic_ai_json(ledger: Ledger) -> None:
    messages: list[ModelMessage] = [
        ModelRequest(parts=[SystemPromptPart("Be terse."), UserPromptPart("Weather?")]),
        ModelResponse(parts=[ToolCallPart("w", {"city": "Oslo"}, "c1")], model_name="m"),
        ModelRequest(parts=[ToolReturnPart("w", {"temp": 4.5}, tool_call_id="c1")]),
        ModelResponse(parts=[TextPart("4.5 C.")], model_name="m"),
    ]
    exported = ModelMessagesTypeAdapter.dump_json(messages)  # pydantic-ai's own format
    history = LedgerHistory("pai-move", ledger=ledger)
    assert await history.save(ModelMessagesTypeAdapter.validate_json(exported)) == 4
    assert ModelMessagesTypeAdapter.dump_json(await history.load()) == exported


async def test_a_failed_model_call_never_duplicates_history(
    ledger: Ledger, fake_llm: FakeLLM
) -> None:
    """pydantic-ai merges the failed turn's request with the next one into one
    ModelRequest; the processor must see that the first part of it is stored."""
    from pydantic_ai.exceptions import ModelHTTPError

    fake_llm.script("pai-fail", [server_error()], then=ok("fine"))
    client = AsyncOpenAI(base_url=fake_llm.base_url, api_key="test", max_retries=0)
    history = LedgerHistory(f"pai-fail-{next(_ids)}", ledger=ledger)
    agent = Agent(
        OpenAIChatModel("pai-fail", provider=OpenAIProvider(openai_client=client)),
        capabilities=[history.capability()],
    )
    try:
        with pytest.raises(ModelHTTPError):
            await agent.run("one", message_history=await history.load())
        for text in ("two", "three", "four"):
            result = await agent.run(text, message_history=await history.load())
            await history.save(result.all_messages())
    finally:
        await client.close()

    def prompts(messages: list[ModelMessage]) -> list[str]:
        return [str(p.content) for m in messages for p in m.parts if isinstance(p, UserPromptPart)]

    assert prompts(await history.load()) == ["one", "two", "three", "four"]
    last = fake_llm.calls("pai-fail")[-1].messages
    assert [m["content"] for m in last if m["role"] == "user"] == ["one", "two", "three", "four"]
