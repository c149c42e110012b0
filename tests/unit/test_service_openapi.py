"""The OpenAPI document in the repository is the one the app serves."""

from __future__ import annotations

import json

import pytest

from contextledger.errors import ConfigError
from contextledger.http.openapi import DOCUMENT, current, render
from contextledger.http.settings import Settings


def test_committed_document_matches_the_app() -> None:
    committed = DOCUMENT.read_text()
    assert committed == render(current()), (
        "openapi.json is stale: run `.venv/bin/python -m contextledger.http.openapi`"
    )
    paths = json.loads(committed)["paths"]
    assert "/v1/chat/completions" in paths and "/v1/sessions/{session_id}/messages" in paths
    params = {p["name"] for p in paths["/v1/sessions/{session_id}/messages"]["post"]["parameters"]}
    assert {"idempotency-key", "if-match"} <= {p.lower() for p in params}


def test_settings_from_environment() -> None:
    env = {
        "CONTEXTLEDGER_PORT": "9001",
        "CONTEXTLEDGER_UPSTREAM_API_BASE": "http://127.0.0.1:1/v1",
        "CONTEXTLEDGER_MODEL_MAP": '{"gpt-4o": "openai/local-model"}',
        "CONTEXTLEDGER_FALLBACKS": "openai/a, openai/b",
        "CONTEXTLEDGER_PASS_CLIENT_KEY": "true",
        "CONTEXTLEDGER_PROXY_TOKEN_BUDGET": "",
    }
    s = Settings.from_env(env, host="::1")
    assert (s.port, s.host, s.local_only, s.pass_client_key) == (9001, "::1", True, True)
    assert s.model_map == {"gpt-4o": "openai/local-model"}
    assert s.fallbacks == ("openai/a", "openai/b") and s.proxy_token_budget is None
    assert not Settings(host="0.0.0.0").local_only


def test_a_bad_setting_names_its_variable() -> None:
    with pytest.raises(ConfigError) as info:
        Settings.from_env({"CONTEXTLEDGER_PORT": "eighty"})
    assert info.value.details["key"] == "port" and "CONTEXTLEDGER_PORT" in str(info.value)
