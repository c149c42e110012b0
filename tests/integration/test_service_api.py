"""The REST API over a real PostgreSQL: every route is a Session/Ledger call."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import pytest_asyncio
import structlog

from contextledger import Ledger
from contextledger.http import rest
from contextledger.http.settings import Settings
from tests.integration.service_support import Running, appends_held, metric, running_service

PROBLEM = "application/problem+json"


@pytest_asyncio.fixture
async def svc(pg_dsn: str) -> AsyncIterator[Running]:
    async with running_service(Settings(dsn=pg_dsn, migrate=False)) as running:
        yield running


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


async def test_create_append_and_read_back(svc: Running, pg_dsn: str) -> None:
    c = svc.client
    r = await c.post("/v1/sessions", json={"session_id": "s1", "model": "gpt-4o"})
    assert r.status_code == 201 and r.json()["head"] == 1
    again = await c.post("/v1/sessions", json={"session_id": "s1"})
    assert again.status_code == 409
    assert again.headers["content-type"] == PROBLEM and again.json()["code"] == "SESSION_EXISTS"
    r = await c.post("/v1/sessions/s1/messages", json={"message": user("hello")})
    assert r.status_code == 201 and r.json() == {"seqs": [2], "head": 2}
    assert r.headers["etag"] == '"2"'
    r = await c.post(
        "/v1/sessions/s1/messages",
        json={"messages": [{"role": "assistant", "content": "hi"}, user("how are you")]},
    )
    assert r.json()["seqs"] == [3, 4]
    branch = (await c.get("/v1/sessions/s1/messages")).json()["messages"]
    assert [m["content"] for m in branch] == ["hello", "hi", "how are you"]
    async with Ledger.open(pg_dsn) as ledger:  # the library sees exactly what the API wrote
        session = await ledger.session("s1", create=False)
        assert await session.get_messages() == branch
        assert (await c.get("/v1/sessions/s1/context", params={"at": 3})).json()[
            "messages"
        ] == await session.request_at(3)


async def test_idempotency_key_and_if_match(svc: Running) -> None:
    c = svc.client
    await c.post("/v1/sessions", json={"session_id": "s"})
    headers = {"Idempotency-Key": "k1"}
    first = await c.post("/v1/sessions/s/messages", json={"message": user("a")}, headers=headers)
    retry = await c.post("/v1/sessions/s/messages", json={"message": user("a")}, headers=headers)
    assert first.json()["seqs"] == retry.json()["seqs"] == [2]
    other = await c.post("/v1/sessions/s/messages", json={"message": user("b")}, headers=headers)
    assert other.status_code == 409 and other.json()["code"] == "IDEMPOTENCY_CONFLICT"
    stale = await c.post(
        "/v1/sessions/s/messages", json={"message": user("c")}, headers={"If-Match": '"1"'}
    )
    assert stale.status_code == 409
    assert stale.json()["code"] == "CONCURRENCY_CONFLICT" and stale.json()["head"] == 2
    fresh = await c.post(
        "/v1/sessions/s/messages", json={"message": user("c")}, headers={"If-Match": '"2"'}
    )
    assert fresh.status_code == 201 and fresh.json()["head"] == 3


async def test_a_rejected_batch_writes_nothing(svc: Running) -> None:
    c = svc.client
    await c.post("/v1/sessions", json={"session_id": "s"})
    r = await c.post(
        "/v1/sessions/s/messages", json={"messages": [user("fine"), {"role": "wizard"}]}
    )
    assert r.status_code == 422 and r.headers["content-type"] == PROBLEM
    body = r.json()
    assert body["code"] == "INVALID_MESSAGE" and body["index"] == 1 and body["field"] == "role"
    assert (await c.get("/v1/sessions/s")).json()["head"] == 1
    missing = await c.post("/v1/sessions/nope/messages", json={"message": user("x")})
    assert missing.status_code == 404 and missing.json()["code"] == "SESSION_NOT_FOUND"
    bad = await c.post("/v1/sessions/s/messages", json={"message": user("x"), "extra": 1})
    assert bad.status_code == 422 and bad.json()["code"] == "INVALID_REQUEST"


async def test_a_batch_is_one_transaction(svc: Running) -> None:
    # A batch the pre-check passes but the append refuses (a message over the session's
    # size limit) writes none of its messages; a batch's Idempotency-Key and If-Match
    # cover it whole.
    c = svc.client
    await c.post("/v1/sessions", json={"session_id": "b", "config": {"max_message_bytes": 2000}})
    big = await c.post(
        "/v1/sessions/b/messages", json={"messages": [user("fine"), user("x" * 5000)]}
    )
    assert big.status_code in (413, 422) and big.headers["content-type"] == PROBLEM
    assert (await c.get("/v1/sessions/b")).json()["head"] == 1
    batch = {"messages": [user("one"), {"role": "assistant", "content": "two"}]}
    key = {"Idempotency-Key": "batch-1"}
    first = await c.post("/v1/sessions/b/messages", json=batch, headers=key)
    retry = await c.post("/v1/sessions/b/messages", json=batch, headers=key)
    assert first.status_code == retry.status_code == 201
    assert first.json()["seqs"] == retry.json()["seqs"] == [2, 3]
    other = {"messages": [user("zero"), {"role": "assistant", "content": "two"}]}
    reused = await c.post("/v1/sessions/b/messages", json=other, headers=key)
    assert reused.status_code == 409 and reused.json()["code"] == "IDEMPOTENCY_CONFLICT"
    stale = await c.post("/v1/sessions/b/messages", json=batch, headers={"If-Match": '"2"'})
    assert stale.status_code == 409 and stale.json()["head"] == 3
    branch = (await c.get("/v1/sessions/b/messages")).json()["messages"]
    assert [m["content"] for m in branch] == ["one", "two"]


async def test_sessions_are_listed_page_by_page(svc: Running) -> None:
    c = svc.client
    ids = [f"p{i}" for i in range(5)]
    for i in ids:
        await c.post("/v1/sessions", json={"session_id": i})
    seen: list[str] = []
    cursor = None
    pages = 0
    while True:
        params: dict[str, Any] = {"limit": 2} | ({"cursor": cursor} if cursor else {})
        page = (await c.get("/v1/sessions", params=params)).json()
        seen += [s["session_id"] for s in page["items"]]
        pages += 1
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == ids and pages == 3
    bad = await c.get("/v1/sessions", params={"cursor": "not-ours"})
    assert bad.status_code == 422 and bad.json()["field"] == "cursor"


async def test_checkpoint_rollback_replay_verify_compact_purge(svc: Running) -> None:
    c = svc.client
    await c.post("/v1/sessions", json={"session_id": "s"})
    for i in range(6):
        await c.post("/v1/sessions/s/messages", json={"message": user(f"turn {i} " * 20)})
    cp = (await c.post("/v1/sessions/s/checkpoints", json={"label": "before"})).json()
    assert cp["label"] == "before" and cp["seq"] == 8
    await c.post("/v1/sessions/s/messages", json={"message": user("regretted")})
    assert [x["label"] for x in (await c.get("/v1/sessions/s/checkpoints")).json()["items"]] == [
        "before"
    ]
    rb = (await c.post("/v1/sessions/s/rollback", json={"to": "before"})).json()
    view = (await c.get("/v1/sessions/s/view")).json()["messages"]
    assert "regretted" not in json.dumps(view) and rb["head"] == 10
    then = (await c.get("/v1/sessions/s/view", params={"at": 9})).json()["messages"]
    assert then[-1]["content"] == "regretted"
    small = (await c.get("/v1/sessions/s/context", params={"token_budget": 150})).json()
    assert 0 < len(small["messages"]) < len(view)
    nope = await c.post("/v1/sessions/s/rollback", json={"to": "never"})
    assert nope.status_code == 404 and nope.json()["code"] == "CHECKPOINT_NOT_FOUND"
    for bad in (True, False, 3.0):  # not seq 1, 0 or 3: refused, nothing written
        refused = await c.post("/v1/sessions/s/rollback", json={"to": bad})
        assert refused.status_code == 422, (bad, refused.text)
    assert (await c.get("/v1/sessions/s")).json()["head"] == 10
    saved = (await c.post("/v1/sessions/s/compact", json={"token_budget": 150})).json()
    assert saved["tokens_saved"] > 0
    assert (await c.get("/v1/sessions/s/verify")).json() | {"events": 0} == {
        "session_id": "s",
        "ok": True,
        "events": 0,
        "first_bad_seq": None,
        "reason": None,
    }
    no_reason = await c.delete("/v1/sessions/s")
    assert no_reason.status_code == 422
    purged = await c.delete("/v1/sessions/s", params={"reason": "test"})
    assert purged.status_code == 200 and purged.json()["purged_events"] >= 11
    assert (await c.get("/v1/sessions/s")).status_code == 404


async def test_events_page_and_live_tail(svc: Running) -> None:
    c = svc.client
    await c.post("/v1/sessions", json={"session_id": "s"})
    for i in range(4):
        await c.post("/v1/sessions/s/messages", json={"message": user(str(i))})
    page = (await c.get("/v1/sessions/s/events", params={"limit": 3})).json()
    assert [e["seq"] for e in page["items"]] == [1, 2, 3] and page["next_from_seq"] == 4
    rest = (await c.get("/v1/sessions/s/events", params={"from_seq": 4})).json()
    assert [e["seq"] for e in rest["items"]] == [4, 5] and rest["next_from_seq"] is None

    seen: list[int] = []

    async def tail() -> None:
        headers = {"Last-Event-ID": "4"}
        async with c.stream("GET", "/v1/sessions/s/events/stream", headers=headers) as r:
            assert r.headers["content-type"].startswith("text/event-stream")
            async for line in r.aiter_lines():
                if line.startswith("id: "):
                    seen.append(int(line[4:]))
                    if len(seen) == 2:
                        return

    reader = asyncio.create_task(tail())
    await asyncio.sleep(0.3)
    await c.post("/v1/sessions/s/messages", json={"message": user("live")})
    await asyncio.wait_for(reader, 10)
    assert seen == [5, 6]


def stream_polls(metrics_text: str) -> float:
    polls = metric(metrics_text, "contextledger_stream_polls_total")
    assert polls is not None
    return polls


async def test_event_streams_of_one_session_share_one_poll(svc: Running) -> None:
    """Five live tails of one session: one poll between them (not five), each tail gets the
    catch-up it asked for and the live event, and the poll ends with the last tail."""
    c = svc.client
    await c.post("/v1/sessions", json={"session_id": "w"})
    await c.post("/v1/sessions/w/messages", json={"message": user("first")})
    before = stream_polls((await c.get("/metrics")).text)
    seen: list[list[int]] = [[] for _ in range(5)]

    async def tail(mine: list[int]) -> None:
        async with c.stream("GET", "/v1/sessions/w/events/stream") as r:
            async for line in r.aiter_lines():
                if line.startswith("id: "):
                    mine.append(int(line[4:]))
                    if len(mine) == 3:
                        return

    loop = asyncio.get_running_loop()
    started = loop.time()
    readers = [asyncio.create_task(tail(mine)) for mine in seen]
    async with asyncio.timeout(10):  # every tail has its catch-up: each is watching
        while any(len(mine) < 2 for mine in seen):  # noqa: ASYNC110 (readers fill them)
            await asyncio.sleep(0.02)
    assert len(svc.app.state.watches) == 1
    await c.post("/v1/sessions/w/messages", json={"message": user("live")})
    await asyncio.wait_for(asyncio.gather(*readers), 10)
    elapsed = loop.time() - started
    polls = stream_polls((await c.get("/metrics")).text) - before
    assert seen == [[1, 2, 3]] * 5
    # one task polling every SSE_POLL_S; five streams polling apiece would be five times that
    assert 1 <= polls <= elapsed / rest.SSE_POLL_S + 3
    async with asyncio.timeout(5):
        while len(svc.app.state.watches):  # noqa: ASYNC110 (the watch ends as the streams close)
            await asyncio.sleep(0.05)


async def test_ops_endpoints_and_metrics(svc: Running) -> None:
    c = svc.client
    assert (await c.get("/healthz")).json() == {"status": "ok"}
    ready = await c.get("/readyz")
    assert ready.status_code == 200 and ready.json()["status"] == "ready"
    await c.post("/v1/sessions", json={"session_id": "m"})
    for i in range(3):
        await c.post("/v1/sessions/m/messages", json={"message": user(f"x {i} " * 40)})
    compacted = await c.post("/v1/sessions/m/compact", json={"token_budget": 200})
    assert compacted.status_code == 200, compacted.text
    assert compacted.json()["tokens_saved"] > 0
    text = (await c.get("/metrics")).text
    assert "contextledger_appends_total 3.0" in text
    assert 'route="/v1/sessions/{session_id}/messages",status="201"} 3.0' in text
    assert "contextledger_http_request_duration_seconds_bucket" in text
    assert 'contextledger_compactions_total{ephemeral="False",strategy="truncate"} 1.0' in text
    assert 'contextledger_pool_connections{tenant="local"}' in text
    assert "contextledger_recall_hits_total 0.0" in text
    assert "contextledger_summaries_total 0.0" in text


async def test_recall_and_summaries_are_counted(svc: Running) -> None:
    c = svc.client
    config = {"compaction_strategy": "summarize", "summarizer": {"offline_fallback": True}}
    await c.post("/v1/sessions", json={"session_id": "rm", "config": config})
    fact = "The vault listens on port 8443 behind the zebraquartz gateway."
    batch = [user(fact)] + [user(f"filler {i} " + "lorem ipsum dolor " * 30) for i in range(40)]
    assert (await c.post("/v1/sessions/rm/messages", json={"messages": batch})).status_code == 201
    await c.post(
        "/v1/sessions/rm/messages", json={"message": user("Which port is zebraquartz on?")}
    )
    view = await c.get("/v1/sessions/rm/context", params={"token_budget": 1500})
    assert view.status_code == 200, view.text
    assert "8443" in json.dumps(view.json()["messages"])  # recall brought the fact back
    summarized = await c.post("/v1/sessions/rm/compact", json={"token_budget": 600})
    assert summarized.status_code == 200, summarized.text
    text = (await c.get("/metrics")).text
    assert "contextledger_recall_hits_total 1.0" in text
    # every line of the block is counted (the fact, and the neighbours that came with it)
    block = next(
        m["content"] for m in view.json()["messages"] if str(m["content"]).startswith("<recall>")
    )
    lines = sum(1 for line in block.splitlines() if line.startswith("[#"))
    assert lines >= 1 and f"contextledger_recalled_messages_total {float(lines)}" in text

    async def recorded() -> int:
        page = await c.get("/v1/sessions/rm/events", params={"limit": 500})
        return sum(1 for e in page.json()["items"] if e["type"] == "summary.recorded")

    while True:  # a background summary may land meanwhile: read until the ledger holds still
        before = await recorded()
        text = (await c.get("/metrics")).text
        if await recorded() == before:
            break
    summaries = re.search(r"^contextledger_summaries_total (\S+)$", text, re.M)
    assert summaries is not None and before >= 1
    assert float(summaries.group(1)) == before  # each summary in the ledger was counted


async def test_access_log_has_no_bodies_or_keys(svc: Running) -> None:
    c = svc.client
    with structlog.testing.capture_logs() as logs:
        await c.post("/v1/sessions", json={"session_id": "log"})
        await c.post(
            "/v1/sessions/log/messages",
            json={"message": user("my secret diary")},
            headers={"Authorization": "Bearer cl_0123456789ab_" + "s" * 40},
        )
    lines = [entry for entry in logs if entry.get("event") == "request"]
    assert [entry["route"] for entry in lines] == [
        "/v1/sessions",
        "/v1/sessions/{session_id}/messages",
    ]
    assert all(entry["status"] == 201 and entry["tenant"] == "local" for entry in lines)
    dumped = json.dumps(logs, default=str)
    assert "secret diary" not in dumped and "sssss" not in dumped


async def test_graceful_shutdown_finishes_in_flight_appends(pg_dsn: str) -> None:
    """Appends held up in the database when shutdown starts still complete and answer."""
    async with running_service(Settings(dsn=pg_dsn, migrate=False)) as running:
        c = running.client
        await c.post("/v1/sessions", json={"session_id": "g"})
        await c.post("/v1/sessions/g/messages", json={"message": user("warm")})

        def start() -> list[asyncio.Task[httpx.Response]]:
            body = [{"message": user(str(i))} for i in range(5)]
            return [asyncio.create_task(c.post("/v1/sessions/g/messages", json=b)) for b in body]

        async with appends_held(pg_dsn, start) as sends:
            running.server.should_exit = True  # shutdown starts with all five in flight
            await asyncio.sleep(0.3)
        answers = await asyncio.gather(*sends)
    assert [r.status_code for r in answers] == [201] * 5
    async with Ledger.open(pg_dsn) as ledger:
        session = await ledger.session("g", create=False)
        assert len(await session.get_messages()) == 6
        assert (await session.verify()).ok


async def test_context_in_a_providers_shape_and_replayed_with_a_budget(
    svc: Running, pg_dsn: str
) -> None:
    c = svc.client
    await c.post("/v1/sessions", json={"session_id": "shape", "model": "gpt-4o"})
    call = {"id": "c1", "type": "function", "function": {"name": "ls", "arguments": "{}"}}
    batch = [
        {"role": "system", "content": "You are terse."},
        user("list the files " + "please " * 200),
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "a.py b.py"},
        user("and now?"),
    ]
    assert (
        await c.post("/v1/sessions/shape/messages", json={"messages": batch})
    ).status_code == 201
    got = await c.get("/v1/sessions/shape/context", params={"provider": "anthropic"})
    assert got.status_code == 200, got.text
    body = got.json()
    async with Ledger.open(pg_dsn) as ledger:
        session = await ledger.session("shape", create=False)
        want = await session.request_for("anthropic")
        small = await session.request_at(body["at"], token_budget=150)
    assert body["provider"] == "anthropic" and body["system"] == want.system == "You are terse."
    assert body["messages"] == want.messages
    assert any(b.get("type") == "tool_use" for m in body["messages"] for b in m["content"])
    # a replay honours the budget asked for, as request_at does
    replayed = await c.get(
        "/v1/sessions/shape/context", params={"at": body["at"], "token_budget": 150}
    )
    assert replayed.json()["messages"] == small
    full = await c.get("/v1/sessions/shape/context", params={"at": body["at"]})
    assert len(small) < len(full.json()["messages"])
    # a shape nobody speaks is refused, not answered in the default shape
    bad = await c.get("/v1/sessions/shape/context", params={"provider": "claude-3"})
    assert bad.status_code == 422
    assert bad.headers["content-type"].startswith("application/problem+json")


async def test_odd_headers_get_their_meaning_or_a_clear_refusal(svc: Running) -> None:
    c = svc.client
    await c.post("/v1/sessions", json={"session_id": "hd"})
    path = "/v1/sessions/hd/messages"
    # If-Match: * is "whatever the head is" (RFC 9110), not a malformed seq
    star = await c.post(path, json={"message": user("a")}, headers={"If-Match": "*"})
    assert star.status_code == 201, star.text
    for bad in ("99999999999999999999", "12a", "²"):  # beyond bigint, not a number, not ASCII
        sent = {"Last-Event-ID": bad.encode("latin-1")}
        tail = await c.get("/v1/sessions/hd/events/stream", headers=sent)
        assert tail.status_code == 422, (bad, tail.text)
        assert tail.json()["code"] == "INVALID_ARGUMENT"
    assert [e["seq"] for e in (await c.get("/v1/sessions/hd/events")).json()["items"]] == [1, 2]


@pytest.mark.usefixtures("serial_migrations")
async def test_readyz_says_why_it_is_not_ready(pg_dsn: str) -> None:
    from alembic import command

    from contextledger.store.migrate import alembic_config, head_revision

    async with running_service(Settings(dsn=pg_dsn, migrate=False)) as running:
        c = running.client
        assert (await c.get("/readyz")).status_code == 200
        # the schema one migration behind the code: not ready, and which revisions
        await asyncio.to_thread(command.downgrade, alembic_config(pg_dsn), "-1")
        behind = await c.get("/readyz")
        assert behind.status_code == 503
        assert behind.json()["status"] == "unavailable"
        assert f"code needs {head_revision()}" in behind.json()["detail"]
        assert (await c.get("/healthz")).status_code == 200  # alive, only not ready


async def test_requests_at_once_on_a_shared_handle_catch_it_up_once(
    svc: Running, pg_dsn: str
) -> None:
    # The service shares one handle between clients; another process appended since its
    # view was cached: requests built at once each read the new events, and each pushed
    # them into the one view (the branch's messages three times over, to the model too).
    c = svc.client
    await c.post("/v1/sessions", json={"session_id": "dup", "model": "gpt-4o"})
    for i in range(3):
        await c.post("/v1/sessions/dup/messages", json={"message": user(f"own{i}")})
    await c.get("/v1/sessions/dup/context")  # the handle's view, cached
    async with Ledger.open(pg_dsn) as other:
        theirs = await other.session("dup", create=False)
        for i in range(5):
            await theirs.add_message(user(f"other{i}"))
    found = await asyncio.gather(*(c.get("/v1/sessions/dup/context") for _ in range(8)))
    branch = [m["content"] for m in (await c.get("/v1/sessions/dup/messages")).json()["messages"]]
    assert len(branch) == 8
    for r in [*found, await c.get("/v1/sessions/dup/context")]:
        assert [m["content"] for m in r.json()["messages"]] == branch


async def test_one_clients_token_budget_is_not_the_next_clients_default(svc: Running) -> None:
    c = svc.client
    await c.post("/v1/sessions", json={"session_id": "bud", "model": "gpt-4o"})
    await c.post(
        "/v1/sessions/bud/messages",
        json={"messages": [user(f"note {i} " + "x" * 200) for i in range(20)]},
    )
    whole = (await c.get("/v1/sessions/bud/context")).json()["messages"]
    small = (await c.get("/v1/sessions/bud/context", params={"token_budget": 150})).json()
    assert len(small["messages"]) < len(whole) == 20
    assert (await c.get("/v1/sessions/bud/context")).json()["messages"] == whole
    replay = await c.get("/v1/sessions/bud/context", params={"at": small["at"]})
    assert replay.json()["messages"] == whole
    assert (await c.post("/v1/sessions/bud/compact", json={})).json()["tokens_saved"] == 0


async def test_a_view_a_provider_cannot_take_is_a_422_not_a_500(svc: Running) -> None:
    c = svc.client
    await c.post("/v1/sessions", json={"session_id": "bare", "model": "gpt-4o"})
    r = await c.get("/v1/sessions/bare/context", params={"provider": "anthropic"})
    assert r.status_code == 422 and r.headers["content-type"] == PROBLEM
    assert r.json()["code"] == "UNRENDERABLE"


async def test_each_context_names_the_seq_it_replays_at_whatever_runs_beside_it(
    svc: Running,
) -> None:
    # Clients append and read one session at once through one shared handle: the "at"
    # each context answer names is the seq its own view was built at (it was the head
    # read after the build, which another client's append may have moved).
    c = svc.client
    await c.post("/v1/sessions", json={"session_id": "at", "model": "gpt-4o"})
    await c.post("/v1/sessions/at/messages", json={"message": user("first")})

    async def append(i: int) -> None:
        await c.post("/v1/sessions/at/messages", json={"message": user(f"a{i}")})

    async def read() -> dict[str, Any]:
        answer: dict[str, Any] = (await c.get("/v1/sessions/at/context")).json()
        return answer

    for _ in range(6):
        done = await asyncio.gather(*(append(i) for i in range(4)), *(read() for _ in range(6)))
        for answer in done[4:]:
            assert isinstance(answer, dict)
            replay = await c.get("/v1/sessions/at/context", params={"at": answer["at"]})
            assert replay.json()["messages"] == answer["messages"]
