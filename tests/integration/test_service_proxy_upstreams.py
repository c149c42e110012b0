"""Where the proxy's requests go and with which key: fallbacks at their own endpoints,
the provider's own key variable when none is configured.

Driven by the real ``openai`` SDK over HTTP; the upstreams are tests/fakellm.py servers.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import openai
import pytest
from openai import AsyncOpenAI

from contextledger.http.settings import Fallback, Settings
from contextledger.http.upstream import USER_AGENT
from tests.fakellm import FakeLLM, ok, running_fake_llm, server_error
from tests.integration.service_support import (
    branch,
    client,
    new_key,
    reply_text,
    running_service,
)

PATHS = pytest.mark.parametrize("relay", [True, False], ids=["relay", "litellm"])


@pytest.fixture
def backup() -> Iterator[FakeLLM]:
    """A second provider, at its own address."""
    with running_fake_llm() as server:
        yield server


@PATHS
@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_a_fallback_reaches_another_provider_with_its_own_key(
    pg_dsn: str, fake: FakeLLM, backup: FakeLLM, relay: bool, stream: bool
) -> None:
    fake.script("m", [server_error()])
    backup.script("spare", [ok("from the other provider")])
    env = {
        "CONTEXTLEDGER_UPSTREAM_API_BASE": fake.base_url,
        "CONTEXTLEDGER_UPSTREAM_API_KEY": "primary-secret",
        "CONTEXTLEDGER_FALLBACKS": json.dumps(
            [{"model": "hosted_vllm/spare", "api_base": backup.base_url, "api_key": "spare-key"}]
        ),
    }
    settings = Settings.from_env(env, dsn=pg_dsn, migrate=False, upstream_relay=relay)
    async with running_service(settings) as svc:
        response = await client(svc, "elsewhere").chat.completions.create(
            model="m", messages=[{"role": "user", "content": "x"}], stream=stream
        )
        text = await reply_text(response)
        stored = await branch(svc, pg_dsn, "elsewhere")
    assert text == "from the other provider"
    assert fake.models_called() == ["m"]  # the primary failed; nothing else went there
    [spare] = backup.calls()
    assert spare.model == "spare" and spare.headers["authorization"] == "Bearer spare-key"
    assert fake.calls()[0].headers["authorization"] == "Bearer primary-secret"
    assert stored[-1] == {"role": "assistant", "content": "from the other provider"}


async def test_a_fallback_by_name_keeps_the_upstreams_endpoint_and_key(
    pg_dsn: str, fake: FakeLLM
) -> None:
    # the plain form, as before: the same base URL and key as the primary
    fake.script("m", [server_error()])
    fake.script("spare", [ok("same place")])
    env = {"CONTEXTLEDGER_FALLBACKS": "hosted_vllm/spare"}
    settings = Settings.from_env(
        env, dsn=pg_dsn, migrate=False, upstream_api_base=fake.base_url, upstream_api_key="k1"
    )
    async with running_service(settings) as svc:
        reply = await client(svc, "by-name").chat.completions.create(
            model="m", messages=[{"role": "user", "content": "x"}]
        )
    assert reply.choices[0].message.content == "same place"
    assert fake.models_called() == ["m", "spare"]
    assert [r.headers["authorization"] for r in fake.calls()] == ["Bearer k1", "Bearer k1"]


@PATHS
async def test_without_a_configured_key_the_providers_variable_is_used(
    pg_dsn: str, fake: FakeLLM, monkeypatch: pytest.MonkeyPatch, relay: bool
) -> None:
    # litellm reads HOSTED_VLLM_API_KEY for a hosted_vllm model given no key; a literal
    # placeholder key from the proxy would override it
    monkeypatch.setenv("HOSTED_VLLM_API_KEY", "from-the-environment")
    settings = Settings(
        dsn=pg_dsn, migrate=False, upstream_api_base=fake.base_url, upstream_relay=relay
    )
    async with running_service(settings) as svc:
        await client(svc, "env-key").chat.completions.create(
            model="m", messages=[{"role": "user", "content": "x"}]
        )
    [sent] = fake.calls()
    assert sent.headers["authorization"] == "Bearer from-the-environment"
    assert (sent.headers.get("user-agent") == USER_AGENT) == relay


@PATHS
@pytest.mark.parametrize("provider", ["hosted_vllm", "openai"])
async def test_a_keyless_local_upstream_is_still_reached(
    pg_dsn: str, fake: FakeLLM, monkeypatch: pytest.MonkeyPatch, relay: bool, provider: str
) -> None:
    for name in ("HOSTED_VLLM_API_KEY", "OPENAI_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    settings = Settings(
        dsn=pg_dsn,
        migrate=False,
        upstream_api_base=fake.base_url,
        upstream_provider=provider,
        upstream_relay=relay,
    )
    async with running_service(settings) as svc:
        reply = await client(svc, "keyless").chat.completions.create(
            model="m", messages=[{"role": "user", "content": "x"}]
        )
    assert reply.choices[0].message.content
    assert fake.models_called() == ["m"]


def usage_lines(metrics: str) -> dict[tuple[str, str, str], float]:
    """``contextledger_proxy_usage_tokens_total`` by (tenant, model, kind)."""
    out = {}
    for line in metrics.splitlines():
        if line.startswith("contextledger_proxy_usage_tokens_total{"):
            labels, value = line.removeprefix("contextledger_proxy_usage_tokens_total").split()
            pairs = dict(p.split("=", 1) for p in labels.strip("{}").split(","))
            key = tuple(pairs[n].strip('"') for n in ("tenant", "model", "kind"))
            out[key] = float(value)
    return out


@PATHS
@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_usage_is_counted_by_tenant_and_by_the_model_that_answered(
    pg_dsn: str, fake: FakeLLM, backup: FakeLLM, relay: bool, stream: bool
) -> None:
    fake.script("m", [ok("twelve chars"), server_error()])
    backup.script("spare", [ok("sixteen chars..")])
    settings = Settings(
        dsn=pg_dsn,
        migrate=False,
        upstream_api_base=fake.base_url,
        upstream_relay=relay,
        fallbacks=(Fallback("hosted_vllm/spare", backup.base_url, "k"),),
    )
    keys = {tenant: await new_key(pg_dsn, tenant) for tenant in ("alpha", "beta")}
    async with running_service(settings) as svc:
        for tenant in ("alpha", "beta"):  # alpha is answered by m, beta by the fallback
            oai = AsyncOpenAI(
                base_url=f"{svc.url}/v1",
                api_key=keys[tenant],
                default_headers={"X-Session-Id": "s"},
                max_retries=0,
            )
            response = await oai.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "x"}], stream=stream
            )
            if isinstance(response, openai.AsyncStream):
                [c async for c in response]
        metrics = await svc.client.get("/metrics", headers={"X-ContextLedger-Key": keys["alpha"]})
    assert usage_lines(metrics.text) == {
        ("alpha", "m", "prompt"): 10.0,
        ("alpha", "m", "completion"): 3.0,
        ("beta", "spare", "prompt"): 10.0,
        ("beta", "spare", "completion"): 3.0,
    }
