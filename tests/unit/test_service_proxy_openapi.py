"""The proxy route's body and session header in the OpenAPI document, which FastAPI
only documents: the route reads its own body."""

from __future__ import annotations

import json

from contextledger.http import proxy
from contextledger.http.lane import PROXY, route
from contextledger.http.openapi import DOCUMENT


def test_the_document_declares_the_body_and_the_session_header() -> None:
    operation = json.loads(DOCUMENT.read_text())["paths"]["/v1/chat/completions"]["post"]
    headers = {p["name"]: p for p in operation["parameters"] if p["in"] == "header"}
    assert headers["X-Session-Id"]["required"] is False
    body = operation["requestBody"]
    assert body["required"] is True
    schema = body["content"]["application/json"]["schema"]
    assert schema["required"] == ["model", "messages"]
    assert schema["additionalProperties"] is False  # only the allow-listed parameters
    assert {"model", "messages", "user", "stream"} <= set(schema["properties"])
    assert "user" in schema["properties"]["messages"]["items"]["properties"]["role"]["enum"]


def test_fastapi_parses_nothing_for_the_route() -> None:
    declared = route(proxy.router, PROXY)
    assert declared.body_field is None
    assert not declared.dependant.header_params and not declared.dependant.body_params
