"""The proxy's fallbacks as ``CONTEXTLEDGER_FALLBACKS`` (and ``--fallbacks``) give them."""

from __future__ import annotations

import json

import pytest

from contextledger.errors import ConfigError
from contextledger.http.settings import Fallback, Settings
from contextledger.http.upstream import Route, routes


def fallbacks(raw: str) -> tuple[str | Fallback, ...]:
    return Settings.from_env({"CONTEXTLEDGER_FALLBACKS": raw}).fallbacks


def test_names_alone_read_as_before() -> None:
    assert fallbacks("openai/a, openai/b") == ("openai/a", "openai/b")
    assert fallbacks("") == ()


def test_a_json_list_gives_each_fallback_its_own_endpoint() -> None:
    raw = json.dumps(
        [
            "hosted_vllm/same-place",
            {"model": "anthropic/claude-x", "api_key": "sk-ant"},
            {"model": "openai/spare", "api_base": "http://spare:8000/v1", "api_key": "k2"},
        ]
    )
    assert fallbacks(raw) == (
        "hosted_vllm/same-place",
        Fallback("anthropic/claude-x", None, "sk-ant"),
        Fallback("openai/spare", "http://spare:8000/v1", "k2"),
    )


@pytest.mark.parametrize(
    "raw",
    [
        "[",
        '[{"api_base": "http://x"}]',
        '[{"model": "m", "api_bse": "http://x"}]',
        '[{"model": "m", "api_key": 5}]',
        "[3]",
    ],
)
def test_a_bad_fallback_names_its_variable(raw: str) -> None:
    with pytest.raises(ConfigError) as info:
        fallbacks(raw)
    assert info.value.details["key"] == "fallbacks"
    assert "CONTEXTLEDGER_FALLBACKS" in str(info.value)


def test_routes_inherit_the_upstream_only_for_a_name() -> None:
    settings = Settings(
        upstream_api_base="http://primary/v1",
        fallbacks=("hosted_vllm/b", Fallback("anthropic/c", None, "sk-ant")),
    )
    assert routes(settings, "hosted_vllm/a", "k") == [
        Route("hosted_vllm/a", "http://primary/v1", "k"),
        Route("hosted_vllm/b", "http://primary/v1", "k"),
        Route("anthropic/c", None, "sk-ant"),
    ]
    # every key present for litellm: a None keeps the fallback off the primary's endpoint
    assert Route("anthropic/c", None, None).litellm_kwargs() == {
        "model": "anthropic/c",
        "api_base": None,
        "api_key": None,
    }
