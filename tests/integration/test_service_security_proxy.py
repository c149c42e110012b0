"""Issue 26, the proxy: nothing a client sends chooses where the server connects or
which key it uses. Over real HTTP to the service, against a real PostgreSQL; a second
tests/fakellm.py server plays the attacker's URL, and must see nothing."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from contextledger.errors import ConfigError
from contextledger.http.app import create_app
from contextledger.http.settings import Fallback, Settings
from tests.fakellm import FakeLLM, ok, running_fake_llm
from tests.integration.service_support import proxy_service, running_service

PATHS = pytest.mark.parametrize("relay", [True, False], ids=["relay", "litellm"])
STREAM = pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])


@pytest.fixture
def attacker() -> Iterator[FakeLLM]:
    with running_fake_llm() as server:
        yield server


def chat(session: str, **body: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": "hi"}], **body}


async def post(svc: Any, session: str, body: dict[str, Any]) -> httpx.Response:
    return await svc.client.post(
        "/v1/chat/completions", json=body, headers={"X-Session-Id": session}
    )


@PATHS
@STREAM
@pytest.mark.parametrize(
    "field",
    ["base_url", "api_base", "api_key", "mock_response", "custom_llm_provider", "extra_headers"],
)
async def test_a_litellm_control_argument_is_refused_and_nothing_is_sent(
    pg_dsn: str, fake: FakeLLM, attacker: FakeLLM, relay: bool, stream: bool, field: str
) -> None:
    value: Any = {
        "base_url": attacker.base_url,
        "api_base": attacker.base_url,
        "api_key": "attacker-key",
        "mock_response": "canned",
        "custom_llm_provider": "openai",
        "extra_headers": {"X-Evil": "1"},
    }[field]
    async with proxy_service(pg_dsn, fake, relay) as svc:
        r = await post(svc, "victim", chat("victim", stream=stream, **{field: value}))
        assert r.status_code == 422, r.text
        assert r.headers["content-type"].startswith("application/problem+json")
        problem = r.json()
        assert problem["code"] == "UNSUPPORTED_PARAMETER"
        assert problem["fields"] == [field]
        assert field in problem["detail"]
        # nothing appended: the session was not even created
        assert (await svc.client.get("/v1/sessions/victim")).status_code == 404
    assert attacker.calls() == []
    assert fake.calls() == []


@PATHS
async def test_unknown_fields_are_named_together(
    pg_dsn: str, fake: FakeLLM, attacker: FakeLLM, relay: bool
) -> None:
    async with proxy_service(pg_dsn, fake, relay) as svc:
        body = chat("s", top_k=7, base_url=attacker.base_url, temperature=0.2)
        r = await post(svc, "s", body)
        assert r.status_code == 422
        assert r.json()["fields"] == ["base_url", "top_k"]
        assert (await svc.client.get("/v1/sessions/s")).status_code == 404
    assert attacker.calls() == [] and fake.calls() == []


@PATHS
async def test_the_operator_may_allow_more_fields_but_never_a_control_argument(
    pg_dsn: str, fake: FakeLLM, attacker: FakeLLM, relay: bool
) -> None:
    fake.script("m", [ok("fine")])
    with pytest.raises(ConfigError, match="api_base"):  # said at the start
        create_app(Settings(dsn=pg_dsn, proxy_parameters=("top_k", "api_base")))
    async with proxy_service(pg_dsn, fake, relay, proxy_parameters=("top_k",)) as svc:
        r = await post(svc, "s", chat("s", api_base=attacker.base_url))
        assert r.status_code == 422 and r.json()["fields"] == ["api_base"]
        r = await post(svc, "s", chat("s", top_k=3, temperature=0.5))
        assert r.status_code == 200, r.text
    assert attacker.calls() == []
    [sent] = fake.calls("m")
    assert sent.headers["authorization"] == "Bearer upstream-secret"
    if relay:  # litellm passes top_k on in its own way; the relay as sent
        assert sent.body["top_k"] == 3


@PATHS
@STREAM
@pytest.mark.parametrize(
    "model", ["openai/m", "anthropic/claude-sonnet-4-5", "ollama/llama3", "azure/gpt-4o"]
)
async def test_a_model_with_a_provider_nobody_configured_is_refused(
    pg_dsn: str, fake: FakeLLM, relay: bool, stream: bool, model: str
) -> None:
    async with proxy_service(pg_dsn, fake, relay) as svc:
        r = await post(svc, "s", {**chat("s", stream=stream), "model": model})
        assert r.status_code == 422, r.text
        assert r.json()["code"] == "MODEL_NOT_ALLOWED"
        assert (await svc.client.get("/v1/sessions/s")).status_code == 404
    assert fake.calls() == []


@PATHS
async def test_configured_models_still_pass(pg_dsn: str, fake: FakeLLM, relay: bool) -> None:
    fake.script("m", [ok("plain")])
    fake.script("real", [ok("mapped")])
    fake.script("prefixed", [ok("own provider")])
    async with proxy_service(pg_dsn, fake, relay, model_map={"alias": "hosted_vllm/real"}) as svc:
        for model, text in [("m", "plain"), ("alias", "mapped"), ("hosted_vllm/prefixed", None)]:
            r = await post(svc, f"s-{len(text or '')}", {**chat("s"), "model": model})
            assert r.status_code == 200, r.text
            if text:
                assert r.json()["choices"][0]["message"]["content"] == text
    assert fake.models_called() == ["m", "real", "prefixed"]


@PATHS
async def test_a_fallback_named_by_the_client_goes_to_its_own_endpoint(
    pg_dsn: str, fake: FakeLLM, attacker: FakeLLM, relay: bool
) -> None:
    # ``attacker`` stands in for the operator's second provider here: the client may
    # name the fallback, and the request goes where the operator said, with its key
    attacker.script("spare", [ok("from the spare")])
    settings = Settings(
        dsn=pg_dsn,
        migrate=False,
        upstream_api_base=fake.base_url,
        upstream_api_key="upstream-secret",
        upstream_relay=relay,
        fallbacks=(Fallback("hosted_vllm/spare", attacker.base_url, "spare-key"),),
    )
    async with running_service(settings) as svc:
        r = await post(svc, "s", {**chat("s"), "model": "hosted_vllm/spare"})
        assert r.status_code == 200, r.text
    [sent] = attacker.calls()
    assert sent.headers["authorization"] == "Bearer spare-key"
    assert fake.calls() == []


async def test_without_an_upstream_base_only_mapped_models_are_served(
    pg_dsn: str, fake: FakeLLM
) -> None:
    settings = Settings(dsn=pg_dsn, migrate=False, upstream_api_key="upstream-secret")
    async with running_service(settings) as svc:
        for model in ("gpt-4o", "openai/gpt-4o", "claude-sonnet-4-5"):
            r = await post(svc, "s", {**chat("s"), "model": model})
            assert r.status_code == 422 and r.json()["code"] == "MODEL_NOT_ALLOWED", model
        assert (await svc.client.get("/v1/sessions/s")).status_code == 404
