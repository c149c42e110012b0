"""The proxy's relay to an OpenAI-compatible upstream (http/upstream.py) against
litellm's path (``upstream_relay=False``): the same answers, records, errors.

Driven by the real ``openai`` SDK over HTTP, upstream = tests/fakellm.py.
"""

from __future__ import annotations

import json
import logging
import socket
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from contextledger.http.settings import Settings
from contextledger.http.upstream import USER_AGENT
from tests.fakellm import (
    FakeLLM,
    Reply,
    completion_body,
    context_exceeded,
    cut_stream,
    html_page,
    ok,
    openai_error,
    rate_limited,
    server_error,
    slow,
    streamed,
)
from tests.integration.service_support import (
    Running,
    branch,
    client,
    metric,
    proxy_service,
    reply_text,
    running_service,
)

PATHS = pytest.mark.parametrize("relay", [True, False], ids=["relay", "litellm"])


service = proxy_service


def relayed(fake: FakeLLM) -> list[bool]:
    """Per upstream request so far: did the relay send it (else litellm)?"""
    return [r.headers.get("user-agent") == USER_AGENT for r in fake.calls()]


def prompt_tokens(metrics: str) -> float:
    return metric(metrics, 'contextledger_proxy_tokens_total{kind="prompt"}') or 0.0


async def test_the_relay_passes_the_upstreams_json_and_the_clients_fields(
    pg_dsn: str, fake: FakeLLM
) -> None:
    def answer(req: Any) -> Reply:
        body = completion_body(req.model, "relayed as is")
        body["system_fingerprint"] = "fp_upstream"  # not in litellm's model: dropped there
        body["x_upstream_extra"] = {"kept": [1, 2]}
        return Reply(body=body)

    fake.script("real-name", [answer])
    tools: Any = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    async with service(
        pg_dsn,
        fake,
        True,
        model_map={"alias": "hosted_vllm/real-name"},
        proxy_parameters=("top_k", "custom"),  # the operator's own extra fields
    ) as svc:
        before = prompt_tokens((await svc.client.get("/metrics")).text)
        raw = await client(svc, "as-is").chat.completions.with_raw_response.create(
            model="alias",
            messages=[{"role": "user", "content": "hi"}],
            temperature=0.25,
            tools=tools,
            tool_choice="auto",
            user="not-forwarded",
            extra_body={"top_k": 7, "custom": {"nested": [1, {"a": None}]}},
        )
        after = prompt_tokens((await svc.client.get("/metrics")).text)
        stored = await branch(svc, pg_dsn, "as-is")
    assert raw.status_code == 200
    data = json.loads(raw.content)
    assert data["x_upstream_extra"] == {"kept": [1, 2]}
    assert data["system_fingerprint"] == "fp_upstream"
    assert after - before == 10  # the fake's usage, counted
    assert relayed(fake) == [True]
    sent = fake.calls("real-name")[0]
    assert sent.headers["authorization"] == "Bearer upstream-secret"
    assert sent.body == {
        "model": "real-name",
        "messages": [{"role": "user", "content": "hi"}],
        "temperature": 0.25,
        "tools": tools,
        "tool_choice": "auto",
        "top_k": 7,
        "custom": {"nested": [1, {"a": None}]},
    }
    assert stored[-1] == {"role": "assistant", "content": "relayed as is"}


async def test_a_provider_the_relay_does_not_speak_goes_through_litellm(
    pg_dsn: str, fake: FakeLLM
) -> None:
    # ``openai/`` with an api_base is relayed; a model litellm knows no provider for is
    # not, and litellm's own error says so (the relay never tried it)
    mapped = {"other": "nosuchprovider/x", "openai/m": "openai/m"}
    async with service(pg_dsn, fake, True, model_map=mapped) as svc:
        with pytest.raises(openai.APIStatusError):
            await client(svc, "other").chat.completions.create(
                model="other", messages=[{"role": "user", "content": "x"}]
            )
        await client(svc, "openai").chat.completions.create(
            model="openai/m", messages=[{"role": "user", "content": "x"}]
        )
    assert relayed(fake) == [True]
    assert fake.calls()[0].model == "m"


FAILURES: list[tuple[str, Reply]] = [
    ("401", openai_error(401, "Incorrect API key", type_="invalid_request_error")),
    ("404", openai_error(404, "The model does not exist", type_="invalid_request_error")),
    ("400", context_exceeded()),
    ("429", rate_limited(0)),
    ("500", server_error()),
    ("502 html", html_page(502)),
    ("503", openai_error(503, "overloaded", type_="server_error")),
]


async def outcomes(svc: Running, calls: int) -> list[tuple[int, str, str]]:
    """(status, problem code, error code) of each of ``calls`` failing calls."""
    seen = []
    for i in range(calls):
        response = await svc.client.post(
            "/v1/chat/completions",
            headers={"X-Session-Id": f"fail-{i}"},
            json={"model": "m", "messages": [{"role": "user", "content": "x"}]},
        )
        body = response.json()
        assert response.headers["content-type"] == "application/problem+json"
        seen.append((response.status_code, body["code"], body["error"]["code"]))
    return seen


async def test_upstream_failures_give_the_same_problems_on_both_paths(
    pg_dsn: str, fake: FakeLLM
) -> None:
    results = {}
    for relay in (True, False):
        fake.script("m", [reply for _, reply in FAILURES])
        async with service(pg_dsn, fake, relay) as svc:
            results[relay] = await outcomes(svc, len(FAILURES))
    assert results[True] == results[False]
    assert [status for status, _, _ in results[True]] == [401, 404, 400, 429, 500, 502, 503]
    assert {code for _, code, _ in results[True]} == {"UPSTREAM_ERROR"}
    assert relayed(fake) == [True] * len(FAILURES) + [False] * len(FAILURES)


@pytest.fixture
def closed_port() -> Iterator[int]:
    """A port that refuses connections for the whole test: bound, never listening. (A port
    bound and released at once could be taken by another test's server meanwhile, which
    then answered the 'unreachable' request: a 422 instead of the 500 in one suite run.)"""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield int(s.getsockname()[1])


async def test_unreachable_and_slow_upstreams_give_the_same_problems_on_both_paths(
    pg_dsn: str, fake: FakeLLM, closed_port: int
) -> None:
    unreachable = f"http://127.0.0.1:{closed_port}/v1"
    results: dict[bool, list[tuple[int, str, str]]] = {}
    for relay in (True, False):
        fake.script("m", [slow(3, "too late")])
        async with service(pg_dsn, fake, relay, upstream_timeout=0.5) as svc:
            results[relay] = await outcomes(svc, 1)
        settings = Settings(
            dsn=pg_dsn, migrate=False, upstream_api_base=unreachable, upstream_relay=relay
        )
        async with running_service(settings) as svc:
            results[relay] += await outcomes(svc, 1)
    assert results[True] == results[False]
    assert [status for status, _, _ in results[True]] == [408, 500]


@PATHS
async def test_streams_record_the_same_reply_on_both_paths(
    pg_dsn: str, fake: FakeLLM, relay: bool
) -> None:
    base = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m"}

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return base | {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

    first = {"name": "lookup", "arguments": ""}
    pieces = [  # a tool call's id, name and arguments spread over several deltas
        chunk({"role": "assistant", "content": "Let me "}),
        chunk({"content": "check."}),
        chunk(
            {"tool_calls": [{"index": 0, "id": "call_a", "type": "function", "function": first}]}
        ),
        chunk({"tool_calls": [{"index": 1, "id": "call_b", "function": {"name": "other"}}]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"q": '}}]}),
        chunk({"tool_calls": [{"index": 1, "function": {"arguments": "{}"}}]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": '"x"}'}}]}),
        chunk({}, "tool_calls"),
        base | {"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 3}},
    ]
    fake.script("m", [streamed(pieces)])
    async with service(pg_dsn, fake, relay) as svc:
        stream = await client(svc, "pieces").chat.completions.create(
            model="m", messages=[{"role": "user", "content": "go"}], stream=True
        )
        got = [c async for c in stream]
        stored = await branch(svc, pg_dsn, "pieces")
        metrics = (await svc.client.get("/metrics")).text
    assert relayed(fake) == [relay]
    assert fake.calls("m")[0].body["stream_options"] == {"include_usage": True}
    assert "".join(c.choices[0].delta.content or "" for c in got if c.choices) == "Let me check."
    assert got[-1].usage is not None and got[-1].usage.prompt_tokens == 7
    assert prompt_tokens(metrics) == 7
    assert stored[-1] == {
        "role": "assistant",
        "content": "Let me check.",
        "tool_calls": [
            {
                "id": "call_a",
                "type": "function",
                "function": {"name": "lookup", "arguments": '{"q": "x"}'},
            },
            {"id": "call_b", "type": "function", "function": {"name": "other", "arguments": "{}"}},
        ],
    }


@PATHS
async def test_a_stream_cut_mid_way_ends_in_an_error_event_and_records_nothing(
    pg_dsn: str, fake: FakeLLM, relay: bool
) -> None:
    fake.script("m", [cut_stream("a long answer that never arrives whole", after=2)])
    async with service(pg_dsn, fake, relay) as svc:
        stream = await client(svc, "cut").chat.completions.create(
            model="m", messages=[{"role": "user", "content": "go"}], stream=True
        )
        got: list[Any] = []
        with pytest.raises(openai.APIError):
            async for c in stream:
                got.append(c)
        stored = await branch(svc, pg_dsn, "cut")
    assert relayed(fake) == [relay]
    assert got  # the chunks before the cut reached the client
    assert stored == [{"role": "user", "content": "go"}]


@PATHS
async def test_a_stream_the_upstream_refuses_is_a_problem(
    pg_dsn: str, fake: FakeLLM, relay: bool
) -> None:
    fake.script("m", [rate_limited(0)])
    async with service(pg_dsn, fake, relay) as svc:
        with pytest.raises(openai.RateLimitError):
            await client(svc, "refused").chat.completions.create(
                model="m", messages=[{"role": "user", "content": "go"}], stream=True
            )


async def test_the_relay_retries_what_is_worth_retrying(pg_dsn: str, fake: FakeLLM) -> None:
    fake.script(
        "m",
        [server_error(), rate_limited(0), ok("third time"), context_exceeded(), server_error()],
    )
    async with service(pg_dsn, fake, True, upstream_retries=2) as svc:
        oai = client(svc, "retried")
        reply = await oai.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "x"}]
        )
        assert reply.choices[0].message.content == "third time"
        assert len(fake.calls("m")) == 3
        with pytest.raises(openai.BadRequestError):  # a 400 is the request's fault: no retry
            await oai.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "y"}]
            )
        assert len(fake.calls("m")) == 4
    async with service(pg_dsn, fake, True) as svc:  # no retries by default
        with pytest.raises(openai.InternalServerError):
            await client(svc, "once").chat.completions.create(
                model="m", messages=[{"role": "user", "content": "z"}]
            )
    assert len(fake.calls("m")) == 5


@pytest.mark.parametrize("stream", [False, True])
async def test_a_failed_relay_goes_on_to_the_fallbacks(
    pg_dsn: str, fake: FakeLLM, stream: bool
) -> None:
    fake.script("m", [server_error()])
    fake.script("backup", [ok("from the backup")])
    async with service(pg_dsn, fake, True, fallbacks=("hosted_vllm/backup",)) as svc:
        response = await client(svc, "fallen").chat.completions.create(
            model="m", messages=[{"role": "user", "content": "x"}], stream=stream
        )
        text = await reply_text(response)
        stored = await branch(svc, pg_dsn, "fallen")
    assert text == "from the backup"
    assert fake.models_called() == ["m", "backup"]
    assert relayed(fake) == [True, False]  # the fallbacks are litellm's
    assert stored[-1] == {"role": "assistant", "content": "from the backup"}


@pytest.mark.parametrize("bypass", [False, True], ids=["proxied", "no_proxy"])
async def test_the_relay_honours_the_proxy_variables_as_litellm_does(
    pg_dsn: str, fake: FakeLLM, monkeypatch: pytest.MonkeyPatch, bypass: bool, closed_port: int
) -> None:
    # the upstream named ``localhost`` goes through HTTP_PROXY (nothing listens there)
    # unless NO_PROXY names it; the test's own calls to 127.0.0.1 never do
    for name in ("HTTP_PROXY", "http_proxy"):
        monkeypatch.setenv(name, f"http://127.0.0.1:{closed_port}")
    for name in ("NO_PROXY", "no_proxy"):
        monkeypatch.setenv(name, "127.0.0.1,localhost" if bypass else "127.0.0.1")
    base = fake.base_url.replace("127.0.0.1", "localhost")
    statuses = {}
    for relay in (True, False):
        settings = Settings(dsn=pg_dsn, migrate=False, upstream_api_base=base, upstream_relay=relay)
        async with running_service(settings) as svc:
            response = await svc.client.post(
                "/v1/chat/completions",
                headers={"X-Session-Id": f"env-{relay}"},
                json={"model": "m", "messages": [{"role": "user", "content": "x"}]},
            )
            statuses[relay] = response.status_code
    assert statuses == ({True: 200, False: 200} if bypass else {True: 500, False: 500})
    assert relayed(fake) == ([True, False] if bypass else [])


@pytest.mark.parametrize("level", [logging.DEBUG, logging.INFO])
async def test_the_forward_is_logged_at_debug_only(
    pg_dsn: str, fake: FakeLLM, caplog: pytest.LogCaptureFixture, level: int
) -> None:
    caplog.set_level(level, logger="contextledger.http.proxy")
    async with service(pg_dsn, fake, True) as svc:
        await client(svc, "logged").chat.completions.create(
            model="m", messages=[{"role": "user", "content": "x"}]
        )
    logged = any("proxy_forward" in r.getMessage() for r in caplog.records)
    assert logged == (level == logging.DEBUG)


@PATHS
@pytest.mark.parametrize("suffix", ["", "/", "/chat/completions"])
async def test_a_base_with_or_without_the_endpoint_reaches_it(
    pg_dsn: str, fake: FakeLLM, relay: bool, suffix: str
) -> None:
    settings = Settings(
        dsn=pg_dsn, migrate=False, upstream_api_base=fake.base_url + suffix, upstream_relay=relay
    )
    async with running_service(settings) as svc:
        await client(svc, "base").chat.completions.create(
            model="m", messages=[{"role": "user", "content": "x"}]
        )
    assert [r.path for r in fake.calls()] == ["/v1/chat/completions"]
    assert relayed(fake) == [relay]


async def test_the_relayed_body_carries_the_view_as_sent(pg_dsn: str, fake: FakeLLM) -> None:
    """The relay writes its body with orjson (the view grows with the session: ``json``
    took ~16x as long at 400 messages): text of any script, quotes and separators reach
    the upstream as the client sent them, turn after turn. What orjson cannot write (an
    integer past 64 bits, which only ``json`` reads) goes by ``json``."""
    from contextledger.http.proxy import _encode

    fake.script("m", [ok(f"reply {i}") for i in range(3)])
    said = ['Grüße 👋 "quoted" \\ back', "line\u2028separator\ttab", "日本語 and ‮bidi"]
    history: list[dict[str, Any]] = []
    async with service(pg_dsn, fake, True) as svc:
        for text in said:
            history.append({"role": "user", "content": text})
            answer = await client(svc, "script").chat.completions.create(
                model="m", messages=history
            )
            history.append({"role": "assistant", "content": answer.choices[0].message.content})
    assert relayed(fake) == [True] * 3
    assert fake.calls("m")[-1].body["messages"] == history[:-1]
    payload = {"model": "m", "messages": [{"role": "user", "content": "x", "n": 2**70}]}
    for plain in (True, False):
        assert json.loads(_encode(payload, plain)) == payload
