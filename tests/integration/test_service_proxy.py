"""The OpenAI-compatible proxy, driven by the real ``openai`` SDK, upstream = fakellm."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx
import openai
import pytest
import pytest_asyncio
from openai import AsyncOpenAI

from contextledger import Ledger
from contextledger.http.proxy import position_key
from contextledger.http.settings import Settings
from tests.fakellm import FakeLLM, ok, server_error, slow, tool_call
from tests.integration.service_support import (
    Running,
    branch,
    client,
    inserts_held,
    running_service,
    until,
    writes_waiting,
)


@pytest_asyncio.fixture
async def svc(pg_dsn: str, fake: FakeLLM) -> AsyncIterator[Running]:
    settings = Settings(
        dsn=pg_dsn,
        migrate=False,
        upstream_api_base=fake.base_url,
        upstream_api_key="upstream-secret",
        proxy_token_budget=400,
    )
    async with running_service(settings) as running:
        yield running


async def test_whole_history_resent_is_appended_once(
    svc: Running, fake: FakeLLM, pg_dsn: str
) -> None:
    fake.script("m", [ok("Hello Ada."), ok("You are Ada.")])
    oai = client(svc, "chat-1")
    history: list[Any] = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi, I'm Ada."},
    ]
    first = await oai.chat.completions.create(model="m", messages=history)
    assert first.choices[0].message.content == "Hello Ada."
    history += [first.choices[0].message.model_dump(), {"role": "user", "content": "Who am I?"}]
    second = await oai.chat.completions.create(model="m", messages=history)
    assert second.choices[0].message.content == "You are Ada."
    stored = await branch(svc, pg_dsn, "chat-1")
    assert [(m["role"], m["content"]) for m in stored] == [
        ("system", "Be brief."),
        ("user", "Hi, I'm Ada."),
        ("assistant", "Hello Ada."),
        ("user", "Who am I?"),
        ("assistant", "You are Ada."),
    ]
    sent = fake.calls("m")[1]
    assert [m["content"] for m in sent.messages] == [m["content"] for m in stored[:4]]
    assert sent.headers["authorization"] == "Bearer upstream-secret"
    # a retry of the second request (the client never saw the answer) appends nothing
    await oai.chat.completions.create(model="m", messages=history)
    assert await branch(svc, pg_dsn, "chat-1") == stored


async def test_the_upstream_gets_the_budgeted_view(
    svc: Running, fake: FakeLLM, pg_dsn: str
) -> None:
    oai = client(svc, "long")
    history: list[Any] = []
    for i in range(12):
        history.append({"role": "user", "content": f"question {i} " + "lorem ipsum " * 30})
        reply = await oai.chat.completions.create(model="m", messages=history)
        history.append({"role": "assistant", "content": reply.choices[0].message.content})
    last = fake.calls("m")[-1]
    stored = await branch(svc, pg_dsn, "long")
    assert len(stored) == 24
    assert len(last.messages) < 23  # the ledger keeps everything; the model got a fitted view
    assert last.messages[-1]["content"] == history[-2]["content"]


async def test_streaming_relays_chunks_and_records_the_reply(
    svc: Running, fake: FakeLLM, pg_dsn: str
) -> None:
    fake.script("m", [ok("a streamed answer in pieces")])
    oai = client(svc, "stream")
    stream = await oai.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "go"}], stream=True
    )
    pieces = [c.choices[0].delta.content async for c in stream if c.choices]
    assert len([p for p in pieces if p]) >= 2
    assert "".join(p or "" for p in pieces) == "a streamed answer in pieces"
    stored = await branch(svc, pg_dsn, "stream")
    assert stored[-1] == {"role": "assistant", "content": "a streamed answer in pieces"}


async def test_tool_calls_round_trip(svc: Running, fake: FakeLLM, pg_dsn: str) -> None:
    fake.script("m", [tool_call("weather", {"city": "Oslo"}, call_id="call_9"), ok("Sunny.")])
    oai = client(svc, "tools")
    tools: Any = [
        {
            "type": "function",
            "function": {"name": "weather", "parameters": {"type": "object", "properties": {}}},
        }
    ]
    history: list[Any] = [{"role": "user", "content": "Weather in Oslo?"}]
    first = await oai.chat.completions.create(model="m", messages=history, tools=tools)
    call = first.choices[0].message.tool_calls
    assert call is not None and call[0].function.name == "weather"
    assert fake.calls("m")[0].body["tools"][0]["function"]["name"] == "weather"
    history += [
        first.choices[0].message.model_dump(),
        {"role": "tool", "tool_call_id": "call_9", "content": "sunny, 21C"},
    ]
    second = await oai.chat.completions.create(model="m", messages=history, tools=tools)
    assert second.choices[0].message.content == "Sunny."
    stored = await branch(svc, pg_dsn, "tools")
    assert [m["role"] for m in stored] == ["user", "assistant", "tool", "assistant"]
    assert stored[1]["tool_calls"][0]["id"] == "call_9"
    assert fake.calls("m")[1].messages[-1] == {
        "role": "tool",
        "tool_call_id": "call_9",
        "content": "sunny, 21C",
    }


async def test_streamed_tool_call_is_recorded(svc: Running, fake: FakeLLM, pg_dsn: str) -> None:
    fake.script("m", [tool_call("lookup", {"q": "x"}, call_id="call_s")])
    oai = client(svc, "stream-tools")
    stream = await oai.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "look it up"}], stream=True
    )
    names = [
        t.function.name
        async for c in stream
        if c.choices and c.choices[0].delta.tool_calls
        for t in c.choices[0].delta.tool_calls
        if t.function is not None
    ]
    assert names == ["lookup"]
    stored = await branch(svc, pg_dsn, "stream-tools")
    assert stored[-1]["tool_calls"][0]["function"] == {"name": "lookup", "arguments": '{"q": "x"}'}


async def test_upstream_errors_and_missing_session(svc: Running, fake: FakeLLM) -> None:
    fake.script("m", [server_error()])
    oai = client(svc, "err")
    with pytest.raises(openai.InternalServerError):
        await oai.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
    anonymous = AsyncOpenAI(base_url=f"{svc.url}/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.UnprocessableEntityError) as info:
        await anonymous.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "x"}]
        )
    assert "X-Session-Id" in str(info.value)
    by_user = await anonymous.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "x"}], user="named-by-user"
    )
    assert by_user.choices[0].message.content
    metrics = (await svc.client.get("/metrics")).text
    assert 'contextledger_proxy_tokens_total{kind="prompt"}' in metrics


async def test_a_body_is_read_as_json_reads_it(svc: Running, fake: FakeLLM, pg_dsn: str) -> None:
    # orjson reads the resent history; what it refuses and ``json`` reads still works
    # (NaN, passed on to the upstream), and what neither reads is a 400 writing nothing.
    fake.script("m", [ok("fine")])
    headers = {"X-Session-Id": "raw", "Content-Type": "application/json"}
    cut = await svc.client.post(
        "/v1/chat/completions", content=b'{"model": "m", "messages": [', headers=headers
    )
    assert cut.status_code == 400 and cut.json()["code"] == "INVALID_REQUEST"
    deep = b'{"model": "m", "messages": [{"role": "user", "content": "x", "n": ' + b"[" * 5000
    deep += b"]" * 5000 + b"}]}"
    nested = await svc.client.post("/v1/chat/completions", content=deep, headers=headers)
    assert nested.status_code == 400 and nested.json()["code"] == "INVALID_REQUEST"
    body = b'{"model": "m", "temperature": NaN, "messages": [{"role": "user", "content": "hi"}]}'
    answered = await svc.client.post("/v1/chat/completions", content=body, headers=headers)
    assert answered.status_code == 200, answered.text
    assert answered.json()["choices"][0]["message"]["content"] == "fine"
    assert fake.calls("m")[-1].body["temperature"] != fake.calls("m")[-1].body["temperature"]
    assert [m["content"] for m in await branch(svc, pg_dsn, "raw")] == ["hi", "fine"]


async def test_the_clients_own_key_can_be_passed_through(pg_dsn: str, fake: FakeLLM) -> None:
    settings = Settings(
        dsn=pg_dsn, migrate=False, upstream_api_base=fake.base_url, pass_client_key=True
    )
    async with running_service(settings) as svc:
        oai = AsyncOpenAI(
            base_url=f"{svc.url}/v1",
            api_key="sk-client-own",
            default_headers={"X-Session-Id": "byok"},
            max_retries=0,
        )
        await oai.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
    assert fake.calls("m")[-1].headers["authorization"] == "Bearer sk-client-own"


async def test_a_rewritten_history_is_recorded_as_such(
    svc: Running, fake: FakeLLM, pg_dsn: str
) -> None:
    oai = client(svc, "edited")
    fake.script("m", [ok("first answer"), ok("second answer")])
    await oai.chat.completions.create(model="m", messages=[{"role": "user", "content": "v1"}])
    edited: list[Any] = [{"role": "user", "content": "v2, edited"}]
    await oai.chat.completions.create(model="m", messages=edited)
    stored = await branch(svc, pg_dsn, "edited")
    assert stored == [*edited, {"role": "assistant", "content": "second answer"}]
    async with Ledger.open(pg_dsn) as ledger:
        session = await ledger.session("edited", create=False)
        events = [e async for e in session.events()]
    assert "messages.replaced" in [e.type for e in events]  # v1 and its answer stay
    # the reply is keyed where it sits and where the client's resend will carry it: at 1,
    # the index after the rewritten history (not at the branch's length before the rewrite)
    assert events[-1].idempotency_key == position_key(
        1, {"role": "assistant", "content": "second answer"}
    )


async def test_an_edit_deep_in_a_longer_history_is_still_seen(
    svc: Running, fake: FakeLLM, pg_dsn: str
) -> None:
    # the proxy remembers what the branch holds instead of reading it each call: an
    # earlier message changed while the history grew must not slip past that memory
    oai = client(svc, "deep-edit")
    history: list[Any] = []
    for i in range(3):
        history.append({"role": "user", "content": f"q{i}"})
        reply = await oai.chat.completions.create(model="m", messages=history)
        history.append({"role": "assistant", "content": reply.choices[0].message.content})
    history[2] = {"role": "assistant", "content": "an answer the client edited"}
    history.append({"role": "user", "content": "q3"})
    await oai.chat.completions.create(model="m", messages=history)
    stored = await branch(svc, pg_dsn, "deep-edit")
    assert stored[:-1] == history
    assert stored[-1]["role"] == "assistant"


async def test_an_edit_of_the_recorded_reply_is_seen(
    svc: Running, fake: FakeLLM, pg_dsn: str
) -> None:
    # the proxy compares the client's own messages as it sent them, and the replies it
    # recorded by their fields: a reply the client changed before resending is seen too
    fake.script("m", [ok("a0"), ok("a1"), ok("a2")])
    oai = client(svc, "reply-edit")
    history: list[Any] = [{"role": "user", "content": "q0"}]
    reply = await oai.chat.completions.create(model="m", messages=history)
    history += [reply.choices[0].message.model_dump(), {"role": "user", "content": "q1"}]
    await oai.chat.completions.create(model="m", messages=history)
    history += [
        {"role": "assistant", "content": "a1, as the client edited it"},
        {"role": "user", "content": "q2"},
    ]
    await oai.chat.completions.create(model="m", messages=history)
    stored = await branch(svc, pg_dsn, "reply-edit")
    assert [m["content"] for m in stored] == [
        "q0",
        "a0",
        "q1",
        "a1, as the client edited it",
        "q2",
        "a2",
    ]


async def test_a_rest_append_between_proxy_calls_is_seen(
    svc: Running, fake: FakeLLM, pg_dsn: str
) -> None:
    fake.script("m", [ok("a0"), ok("a1")])
    oai = client(svc, "mixed")
    history: list[Any] = [{"role": "user", "content": "q0"}]
    await oai.chat.completions.create(model="m", messages=history)
    async with httpx.AsyncClient(base_url=svc.url) as http:
        note = {"role": "user", "content": "a note added through the REST API"}
        response = await http.post("/v1/sessions/mixed/messages", json={"message": note})
        assert response.status_code in (200, 201)
    history += [{"role": "assistant", "content": "a0"}, {"role": "user", "content": "q1"}]
    await oai.chat.completions.create(model="m", messages=history)
    # the client's history no longer matches the branch: recorded as a rewrite, as
    # when the proxy read the branch on every call
    assert await branch(svc, pg_dsn, "mixed") == [*history, {"role": "assistant", "content": "a1"}]
    async with Ledger.open(pg_dsn) as ledger:
        session = await ledger.session("mixed", create=False)
        contents = [
            e.payload.message["content"]
            async for e in session.events()
            if e.type == "message.appended"
        ]
    assert "a note added through the REST API" in contents


async def test_the_reply_is_recorded_after_the_response_and_before_the_next_use(
    svc: Running, fake: FakeLLM, pg_dsn: str
) -> None:
    fake.script("m", [slow(0.5, "a1")])
    oai = client(svc, "after")
    first = asyncio.create_task(
        oai.chat.completions.create(model="m", messages=[{"role": "user", "content": "u1"}])
    )

    async def forwarded() -> bool:
        return bool(fake.calls("m"))

    await until(forwarded, "the request reached the upstream")  # u1 is recorded by then
    async with inserts_held(pg_dsn):
        reply = await first  # answered although its record cannot be written yet
        assert reply.choices[0].message.content == "a1"
        async with Ledger.open(pg_dsn) as ledger:
            elsewhere = await (await ledger.session("after", create=False)).get_messages()
        assert elsewhere == [{"role": "user", "content": "u1"}]
        # a read through the service waits for the record instead of missing it
        read = asyncio.create_task(svc.client.get("/v1/sessions/after/messages"))
        await asyncio.sleep(0.3)  # a read that did not wait would be back by now
    messages = (await read).json()["messages"]
    assert messages == [
        {"role": "user", "content": "u1"},
        {"role": "assistant", "content": "a1"},
    ]


async def test_a_resent_reply_seen_first_by_another_process_is_recorded_once(
    svc: Running, fake: FakeLLM, pg_dsn: str
) -> None:
    fake.script("m", [slow(0.5, "a1"), ok("a2")])
    history: list[Any] = [{"role": "user", "content": "u1"}]
    first = asyncio.create_task(
        client(svc, "two").chat.completions.create(model="m", messages=history)
    )

    async def forwarded() -> bool:
        return bool(fake.calls("m"))

    await until(forwarded, "the request reached the upstream")
    settings = Settings(dsn=pg_dsn, migrate=False, upstream_api_base=fake.base_url)
    async with running_service(settings) as other:
        async with inserts_held(pg_dsn) as held:
            reply = await first  # its record waits for the lock
            history += [reply.choices[0].message.model_dump(), {"role": "user", "content": "u2"}]
            second = asyncio.create_task(
                client(other, "two").chat.completions.create(model="m", messages=history)
            )

            async def both_waiting() -> bool:  # the record here, the resend's append there
                return await writes_waiting(held) >= 2

            await until(both_waiting, "both writes wait for the lock")
        assert (await second).choices[0].message.content == "a2"
    assert await branch(svc, pg_dsn, "two") == [
        {"role": "user", "content": "u1"},
        {"role": "assistant", "content": "a1"},
        {"role": "user", "content": "u2"},
        {"role": "assistant", "content": "a2"},
    ]


async def test_shutdown_waits_for_the_deferred_records(pg_dsn: str) -> None:
    gate = asyncio.Event()
    async with running_service(Settings(dsn=pg_dsn, migrate=False)) as svc:
        tenants = svc.app.state.tenants
        session = await tenants.session("local", "late", create=True)

        async def write() -> None:
            await gate.wait()
            await session.add_message({"role": "assistant", "content": "late"})

        tenants.defer("local", "late", write)
        svc.server.should_exit = True
        await asyncio.sleep(0.3)  # shutdown under way meanwhile: it must not close the ledger
        gate.set()
    async with Ledger.open(pg_dsn) as ledger:
        stored = await (await ledger.session("late", create=False)).get_messages()
    assert stored == [{"role": "assistant", "content": "late"}]


async def test_shutdown_gives_up_on_a_deferred_record_that_never_lands(
    pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from contextledger.http import tenancy

    monkeypatch.setattr(tenancy, "DRAIN_S", 0.2)
    cancelled = asyncio.Event()
    async with running_service(Settings(dsn=pg_dsn, migrate=False)) as svc:
        tenants = svc.app.state.tenants
        await tenants.session("local", "stuck", create=True)

        async def write() -> None:
            try:
                await asyncio.Event().wait()  # a write that never comes back
            except asyncio.CancelledError:
                cancelled.set()
                raise

        async def behind() -> None:
            await asyncio.Event().wait()

        tenants.defer("local", "stuck", write)
        tenants.defer("local", "stuck", behind)  # queued behind it: both must be given up
    assert cancelled.is_set()  # shutdown finished: the write was given up, not awaited forever


async def test_a_refused_request_writes_nothing(svc: Running, fake: FakeLLM, pg_dsn: str) -> None:
    # the new messages are checked before the first is appended: a bad one after good
    # ones is a 422 that leaves the session as it was, and a new session uncreated
    headers = {"X-Session-Id": "checked"}
    first = [{"role": "user", "content": "q0"}]
    answered = await svc.client.post(
        "/v1/chat/completions", headers=headers, json={"model": "m", "messages": first}
    )
    assert answered.status_code == 200
    stored = await branch(svc, pg_dsn, "checked")
    bad = [
        *stored,
        {"role": "user", "content": "a fine question"},
        {"role": "tool", "content": "a result without its call id"},
    ]
    refused = await svc.client.post(
        "/v1/chat/completions", headers=headers, json={"model": "m", "messages": bad}
    )
    assert refused.status_code == 422, refused.text
    assert await branch(svc, pg_dsn, "checked") == stored
    fresh = await svc.client.post(
        "/v1/chat/completions",
        headers={"X-Session-Id": "never-made"},
        json={"model": "m", "messages": [{"role": "user", "content": 5}]},
    )
    assert fresh.status_code == 422, fresh.text
    assert (await svc.client.get("/v1/sessions/never-made")).status_code == 404
    assert len(fake.calls("m")) == 1
