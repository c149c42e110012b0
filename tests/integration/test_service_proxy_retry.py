"""A client's retry through the proxy: after an answer it never saw, and after an
upstream failure. Either way the retry appends nothing twice and the upstream gets
the session's budgeted view, the same the first try got.

Driven by the real ``openai`` SDK over HTTP, upstream = tests/fakellm.py.
"""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from typing import Any

import openai
import pytest

from contextledger import Ledger
from tests.fakellm import FakeLLM, ok, server_error
from tests.integration.service_support import (
    Running,
    branch,
    client,
    proxy_service,
    reply_text,
)

PATHS = pytest.mark.parametrize("relay", [True, False], ids=["relay", "litellm"])
FILLER = "lorem ipsum " * 30  # ~60 tokens a message: a 400-token budget holds a few turns


def service(dsn: str, fake: FakeLLM, relay: bool) -> AbstractAsyncContextManager[Running]:
    return proxy_service(dsn, fake, relay, proxy_token_budget=400)


async def converse(oai: openai.AsyncOpenAI, turns: int) -> list[Any]:
    """``turns`` question/answer pairs, the whole history resent each time."""
    history: list[Any] = []
    for i in range(turns):
        history.append({"role": "user", "content": f"question {i} {FILLER}"})
        reply = await oai.chat.completions.create(model="m", messages=history)
        history.append({"role": "assistant", "content": reply.choices[0].message.content})
    return history


async def event_count(dsn: str, session_id: str) -> int:
    async with Ledger.open(dsn) as ledger:
        session = await ledger.session(session_id, create=False)
        return len([e async for e in session.events()])


@PATHS
@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_a_retry_sends_the_budgeted_view_the_first_try_sent(
    pg_dsn: str, fake: FakeLLM, relay: bool, stream: bool
) -> None:
    async with service(pg_dsn, fake, relay) as svc:
        oai = client(svc, "retried")
        history = await converse(oai, 10)
        stored = await branch(svc, pg_dsn, "retried")
        events = await event_count(pg_dsn, "retried")
        # the client never saw the last answer: it resends the same request
        retry = history[:-1]
        response = await oai.chat.completions.create(model="m", messages=retry, stream=stream)
        text = await reply_text(response)
        assert await branch(svc, pg_dsn, "retried") == stored  # nothing appended twice
    assert await event_count(pg_dsn, "retried") == events
    first, again = fake.calls("m")[-2], fake.calls("m")[-1]
    assert len(first.messages) < len(retry)  # the first try got a fitted view, not all 19
    assert again.messages == first.messages
    assert again.messages[-1]["content"] == retry[-1]["content"]
    assert text  # answered (the upstream answers anew; the recorded reply stays)


@PATHS
async def test_an_upstream_failure_keeps_the_message_and_the_retry_is_answered_once(
    pg_dsn: str, fake: FakeLLM, relay: bool
) -> None:
    async with service(pg_dsn, fake, relay) as svc:
        oai = client(svc, "failed")
        history = await converse(oai, 6)
        fake.script("m", [server_error(), ok("the answer after all")])
        history.append({"role": "user", "content": f"a question that fails once {FILLER}"})
        with pytest.raises(openai.InternalServerError) as info:
            await oai.chat.completions.create(model="m", messages=history)
        assert info.value.status_code >= 500
        problem = info.value.response.json()
        assert problem["code"] == "UPSTREAM_ERROR" and problem["error"]["type"] == "upstream_error"
        # what the client said stays recorded: the ledger holds what happened
        assert (await branch(svc, pg_dsn, "failed")) == history
        reply = await oai.chat.completions.create(model="m", messages=history)
        assert reply.choices[0].message.content == "the answer after all"
        stored = await branch(svc, pg_dsn, "failed")
    assert stored == [*history, {"role": "assistant", "content": "the answer after all"}]
    failed, retried = fake.calls("m")[-2], fake.calls("m")[-1]
    assert len(retried.messages) < len(history)  # the budgeted view, not the raw history
    assert retried.messages == failed.messages
    assert retried.messages[-1]["content"] == history[-1]["content"]


async def test_a_retry_in_another_process_replays_the_view_the_first_try_sent(
    pg_dsn: str, fake: FakeLLM
) -> None:
    """A retry that reaches a process which did not build the first try (another worker,
    a restart) finds the message by the branch index and replays the request there."""
    async with service(pg_dsn, fake, True) as svc:
        history = await converse(client(svc, "elsewhere"), 8)
    async with service(pg_dsn, fake, True) as svc:
        retry = history[:-1]
        await client(svc, "elsewhere").chat.completions.create(model="m", messages=retry)
    first, again = fake.calls("m")[-2], fake.calls("m")[-1]
    assert len(first.messages) < len(retry)
    assert again.messages == first.messages
