"""Schema fuzzing (schemathesis) against the committed OpenAPI document:
no 5xx for any input, and a rejected request writes nothing."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from urllib.parse import quote

import psycopg
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis.checks import not_a_server_error

from contextledger.http.openapi import DOCUMENT
from contextledger.http.settings import Settings
from tests.fakellm import FakeLLM
from tests.integration.service_support import new_key, service_in_thread

schema = schemathesis.openapi.from_dict(json.loads(DOCUMENT.read_text())).exclude(
    path="/v1/sessions/{session_id}/events/stream"  # a live tail never ends by design
)
SEED = [
    {"role": "system", "content": "be brief"},
    {"role": "user", "content": "hello"},
    {"role": "assistant", "content": "hi"},
]
HEAD = 1 + len(SEED)  # session.created, then the seed


def _state(dsn: str) -> tuple[int, ...]:
    """Everything a request could have written, counted."""
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT (SELECT count(*) FROM contextledger.sessions),"
            " (SELECT count(*) FROM contextledger.events),"
            " (SELECT coalesce(sum(head), 0) FROM contextledger.sessions),"
            " (SELECT count(*) FROM contextledger.purges)"
        ).fetchone()
    assert row is not None
    return tuple(int(v) for v in row)


def _service(dsn: str, fake: FakeLLM, key: str | None) -> Iterator[tuple[str, str, dict]]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    # a verified key is trusted for a minute: scrypt (by design ~0.1 s) once, not per call
    cfg = Settings(dsn=dsn, migrate=False, upstream_api_base=fake.base_url, key_cache_seconds=60)
    with service_in_thread(cfg) as url:
        import httpx

        made = httpx.post(f"{url}/v1/sessions", json={"session_id": "s"}, headers=headers)
        made.raise_for_status()
        body = {"messages": SEED}
        httpx.post(f"{url}/v1/sessions/s/messages", json=body, headers=headers).raise_for_status()
        yield url, dsn, headers


@pytest.fixture
def service(pg_dsn: str, fake: FakeLLM) -> Iterator[tuple[str, str, dict[str, str]]]:
    """The service in local mode."""
    yield from _service(pg_dsn, fake, None)


@pytest.fixture
def keyed_service(pg_dsn: str, fake: FakeLLM) -> Iterator[tuple[str, str, dict[str, str]]]:
    """The service in keys-required mode, called with a tenant's key."""
    yield from _service(pg_dsn, fake, asyncio.run(new_key(pg_dsn, "fuzz")))


def _check(case: schemathesis.Case, service: tuple[str, str, dict[str, str]]) -> None:
    url, dsn, headers = service
    params = case.path_parameters
    if params and "session_id" in params and len(json.dumps(case.body, default=str)) % 2 == 0:
        params["session_id"] = "s"  # half the time aim at the real session: deeper code runs
    before = _state(dsn)
    response = case.call(base_url=url, timeout=30, headers=headers)
    case.validate_response(response, checks=[not_a_server_error])
    if response.status_code >= 400:
        assert _state(dsn) == before, (case.method, case.path, response.status_code)
    _settle(case, url, headers)


def _settle(case: schemathesis.Case, url: str, headers: dict[str, str]) -> None:
    """Wait for what the service writes after its response (the proxy records a reply
    past it, ``Tenants.defer``): any later use of the session waits for that write, so
    one read of it does. Else the write could land during the next case and be counted
    as that case's."""
    import httpx

    body = case.body if isinstance(case.body, dict) else {}
    named = (case.path_parameters or {}).get("session_id") or (case.headers or {}).get(
        "X-Session-Id"
    )
    session_id = named or body.get("user")
    if isinstance(session_id, str) and session_id:
        httpx.get(f"{url}/v1/sessions/{quote(session_id, safe='')}", headers=headers, timeout=30)


@schema.parametrize()
@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
def test_no_server_errors_and_rejections_write_nothing(
    case: schemathesis.Case, service: tuple[str, str, dict[str, str]]
) -> None:
    _check(case, service)


@schema.parametrize()
@settings(
    max_examples=4,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
def test_with_keys_required_too(
    case: schemathesis.Case, keyed_service: tuple[str, str, dict[str, str]]
) -> None:
    """The same with a key (the tenant's connections, row-level security in the path)."""
    _check(case, keyed_service)


@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    from_seq=st.one_of(st.none(), st.integers(min_value=-(2**70), max_value=2**70)),
    last_id=st.one_of(st.none(), st.text(max_size=24), st.integers(0, 2**70).map(str)),
    session=st.sampled_from(["s", "nobody", "%20", "a" * 300]),
)
def test_the_live_tail_answers_any_input_without_5xx(
    service: tuple[str, str, dict[str, str]],
    from_seq: int | None,
    last_id: str | None,
    session: str,
) -> None:
    """The live tail, left out of the schema run (it never ends), fuzzed here: its
    answer's status and first bytes, then the client hangs up."""
    import httpx

    url, dsn, headers = service
    sent: dict[str, str | bytes] = dict(headers)
    if last_id is not None:
        sent["Last-Event-ID"] = last_id.encode("utf-8")
    params = {} if from_seq is None else {"from_seq": from_seq}
    before = _state(dsn)
    try:
        with httpx.stream(
            "GET",
            f"{url}/v1/sessions/{session}/events/stream",
            params=params,
            headers=sent,
            timeout=httpx.Timeout(10, read=0.5),
        ) as r:
            # 400: uvicorn's own answer to a header no HTTP parser accepts (control bytes)
            assert r.status_code in (200, 400, 404, 422), (r.status_code, r.read())
            if r.status_code == 200:
                try:  # an event, or nothing yet (past the head): never a broken stream
                    first = next(r.iter_lines())
                    assert first.startswith(("id: ", ":")), first
                except httpx.ReadTimeout:  # only when asked to start past the head
                    resume = last_id is not None and last_id.isascii() and last_id.isdigit()
                    start = int(last_id) + 1 if resume and last_id else (from_seq or 1)
                    assert start > HEAD, (from_seq, last_id)
    except httpx.LocalProtocolError:
        return  # a header value the client itself will not send (e.g. a newline)
    assert _state(dsn) == before
