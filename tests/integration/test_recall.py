"""Recall on both stores: what compaction left out comes back when the turn needs it."""

from __future__ import annotations

import asyncio
import json
import operator
import re
import threading
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any

import asyncpg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contextledger import Ledger
from contextledger.core.chain import GENESIS_HASH, make_event
from contextledger.core.events import MessageAppended, SessionCreated
from contextledger.core.recall import Recalled
from contextledger.errors import LedgerRefused
from contextledger.recall import EMBED_BATCH
from contextledger.session import Session
from contextledger.store import distributed
from contextledger.store.dsn import asyncpg_dsn
from contextledger.store.lexical import neighbours
from contextledger.store.migrate import upgrade
from contextledger.store.postgres import MAX_GATE_GAPS, RECHECK_AFTER, PostgresStore
from tests.examples import examples
from tests.fakellm import FakeLLM, hashed_embedding, running_fake_llm
from tests.integration.conftest import PG_HOST, PG_PORT
from tests.integration.service_support import until

#: A recall line's date: on the first line, and where the day changes (``core.recall._lines``)
DAY = r"( \d{4}-\d\d-\d\d)?"

FACT = "Heads up: the orchard-api gateway binds to 18443 on staging."
QUESTION = "Which port should the health check use for orchard-api in staging?"


def recall_blocks(request: list[dict[str, Any]]) -> list[str]:
    return [
        str(m["content"])
        for m in request
        if isinstance(m.get("content"), str) and m["content"].startswith("<recall>")
    ]


async def chatter(session: Session, n: int, start: int = 0) -> None:
    for i in range(start, start + n):
        await session.add_message(
            {"role": "user", "content": f"step {i}: please tidy the caching module " * 4}
        )
        await session.add_message(
            {"role": "assistant", "content": f"done with step {i}, vacuum looks fine " * 4}
        )


async def planted(
    ledger: Ledger,
    config: dict[str, Any] | None = None,
    *,
    fact: str = FACT,
    question: str = QUESTION,
    sid: str = "r",
) -> Session:
    """``fact`` said early, 40 turns of chatter, ``question`` the latest turn."""
    session = await ledger.session(sid, config={"token_counter": "chars", **(config or {})})
    await session.add_message({"role": "system", "content": "You are a coding agent."})
    await session.add_message({"role": "user", "content": fact})
    await session.add_message({"role": "assistant", "content": "Noted."})
    await chatter(session, 40)
    await session.add_message({"role": "user", "content": question})
    return session


async def test_a_truncated_fact_comes_back_before_the_latest_turn(ledger: Ledger) -> None:
    session = await planted(ledger)
    included: list[dict[str, Any]] = []
    session.hooks.on("context:include", lambda _n, data: included.append(data))
    request = await session.get_messages_for_request(token_budget=2000)
    blocks = recall_blocks(request)
    assert len(blocks) == 1 and re.search(rf"\[#3{DAY} user\] {re.escape(FACT)}", blocks[0])
    assert request[-1]["content"] == QUESTION and recall_blocks([request[-2]]) == blocks
    assert request[0]["role"] == "system"
    assert sum(session.counter.count_message(m) for m in request) <= 2000
    assert included and included[-1]["source"] == "recall" and 3 in included[-1]["seqs"]


async def test_a_participant_s_name_finds_their_turns_and_each_line_names_its_speaker(
    ledger: Ledger,
) -> None:
    # Several people in one conversation, told apart by the messages' ``name``: the name
    # is searchable (PostgreSQL's index holds every string of a message but its role, and
    # memory:// indexes it as well), and a recalled line says who said it.
    session = await ledger.session("named", config={"token_counter": "chars"})
    fact = "I adopted a kestrel, we call him Zip."
    await session.add_message({"role": "user", "name": "Caroline", "content": fact})
    await chatter(session, 20)
    await session.add_message({"role": "user", "name": "Melanie", "content": "Mine is Rook."})
    await session.add_message({"role": "user", "name": "Ann [admin]\n", "content": "Hi."})
    await chatter(session, 20, start=20)
    await session.add_message({"role": "user", "content": "Which pet does Caroline keep?"})
    request = await session.get_messages_for_request(token_budget=3000)
    (block,) = recall_blocks(request)
    assert re.search(rf"\[#2{DAY} user Caroline\] {re.escape(fact)}", block)
    assert "Rook" not in block  # Melanie's: her name is not asked about
    await session.add_message({"role": "user", "content": "And what did Ann say?"})
    request = await session.get_messages_for_request(token_budget=3000)
    (block,) = recall_blocks(request)
    assert re.search(rf"\[#\d+{DAY} user Ann admin\] Hi\.", block)  # no bracket of its own
    assert await session.request_at(session.request_seq, token_budget=3000) == request


async def test_recall_can_be_turned_off(ledger: Ledger) -> None:
    session = await planted(ledger, {"recall": {"enabled": False}})
    request = await session.get_messages_for_request(token_budget=2000)
    assert not recall_blocks(request)
    assert "18443" not in str(request)


async def test_nothing_is_recalled_when_nothing_was_left_out(ledger: Ledger) -> None:
    session = await ledger.session("small", config={"token_counter": "chars"})
    await session.add_message({"role": "user", "content": FACT})
    await session.add_message({"role": "user", "content": QUESTION})
    request = await session.get_messages_for_request(token_budget=5000)
    assert not recall_blocks(request) and len(request) == 2


async def test_summarized_facts_come_back_and_request_at_reproduces(ledger: Ledger) -> None:
    cfg = {"compaction_strategy": "summarize", "auto_compact": True}
    session = await ledger.session("s", config={"token_counter": "chars", **cfg})
    await session.add_message({"role": "user", "content": FACT})
    sent: dict[int, list[dict[str, Any]]] = {}
    for i in range(60):
        await chatter(session, 1, start=i)
        if i % 10 == 9:
            await session.add_message({"role": "user", "content": QUESTION})
            request = await session.get_messages_for_request(token_budget=3000)
            sent[session.request_seq] = request  # a background summary may land after it
    await session.close()  # summaries are made in the background: let the last one land
    assert [e async for e in session.events() if e.type == "summary.recorded"]
    last = max(sent)
    assert any("18443" in b for b in recall_blocks(sent[last]))
    for seq, request in sent.items():  # the ledger alone rebuilds every request
        assert await session.request_at(seq, token_budget=3000) == request


async def test_recall_follows_the_branch_after_a_rollback(ledger: Ledger) -> None:
    session = await ledger.session("b", config={"token_counter": "chars"})
    await session.add_message({"role": "user", "content": "we start the orchard-api work"})
    point = await session.checkpoint("before")
    await session.add_message({"role": "user", "content": FACT})  # abandoned below
    await session.rollback(point)
    await chatter(session, 40)
    await session.add_message({"role": "user", "content": QUESTION})
    request = await session.get_messages_for_request(token_budget=2000)
    assert "18443" not in str(request)
    assert any("orchard-api work" in b for b in recall_blocks(request))


async def test_tool_units_come_back_whole(ledger: Ledger) -> None:
    session = await ledger.session("t", config={"token_counter": "chars"})
    await session.add_message({"role": "user", "content": "describe orchard-api please"})
    await session.add_message(
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "describe_service", "arguments": '{"name": "x"}'},
                }
            ],
        }
    )
    await session.add_message(
        {"role": "tool", "tool_call_id": "c1", "content": '{"owner": "mei@fernhill.io"}'}
    )
    await chatter(session, 40)
    await session.add_message({"role": "user", "content": "Who is the owner of that service?"})
    request = await session.get_messages_for_request(token_budget=2000)
    (block,) = recall_blocks(request)
    assert re.search(rf"\[#3{DAY} assistant\] describe_service\(", block)
    assert re.search(rf'\[#4{DAY} tool result\] {{"owner": "mei@fernhill.io"}}', block)


async def test_an_unknown_text_search_configuration_is_a_typed_error(pg_ledger: Ledger) -> None:
    session = await planted(pg_ledger, {"recall": {"text_search_config": "klingon"}})
    with pytest.raises(Exception) as err:
        await session.get_messages_for_request(token_budget=2000)
    assert getattr(err.value, "code", None) == "INVALID_ARGUMENT"


async def test_another_text_search_configuration_searches_without_the_index(
    pg_ledger: Ledger,
) -> None:
    session = await planted(pg_ledger, {"recall": {"text_search_config": "simple"}})
    request = await session.get_messages_for_request(token_budget=2000)
    assert any("18443" in b for b in recall_blocks(request))


@asynccontextmanager
async def scratch_database() -> AsyncIterator[str]:
    """The DSN of a fresh, empty database on the test server, dropped afterwards."""
    name = f"cl_mig_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(host=PG_HOST, port=PG_PORT, user="postgres", database="postgres")
    await admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"postgresql://postgres@/{name}?host={PG_HOST}&port={PG_PORT}"
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


async def _old_session(dsn: str) -> None:
    """A session with one message, written as an earlier revision's schema holds it: by
    plain SQL, since today's store speaks only today's schema (it names columns that
    later migrations add, such as 0013's ``sessions.erased_at``)."""
    now = datetime.now(UTC)
    first = make_event("old", 1, SessionCreated(None, {}, {}), GENESIS_HASH, created_at=now)
    message = MessageAppended({"role": "user", "content": FACT}, 12, False, "chars")
    second = make_event("old", 2, message, first.hash, created_at=now)
    conn = await asyncpg.connect(asyncpg_dsn(dsn))
    try:
        async with conn.transaction():
            await conn.execute(
                "INSERT INTO contextledger.sessions (session_id, created_at, head, last_hash,"
                " view_tokens, view_count) VALUES ('old', $1, 2, $2, 12, 1)",
                now,
                second.hash,
            )
            for e in (first, second):
                await conn.execute(
                    "INSERT INTO contextledger.events (session_id, seq, type, version, data,"
                    " tokens, created_at, hash) VALUES ('old', $1, $2, $3, $4::jsonb, $5, $6, $7)",
                    e.seq,
                    e.type,
                    e.version,
                    json.dumps(e.payload.to_data()),
                    e.tokens,
                    now,
                    e.hash,
                )
    finally:
        await conn.close()


@pytest.mark.usefixtures("serial_migrations")
async def test_migration_0003_backfills_existing_events(pg_dsn: str) -> None:
    async with scratch_database() as dsn:
        await upgrade(dsn, "0002_view_generations")
        await _old_session(dsn)
        await upgrade(dsn)
        store = await PostgresStore.connect(dsn)
        try:
            found = await store.search(
                "old",
                QUESTION,
                exclude=(),
                upto_seq=2,
                branch=None,
                limit=5,
                text_config="english",
            )
            assert [seq for seq, _ in found] == [2]
        finally:
            await store.close()


@pytest.fixture(name="fake_llm")
def _fake_llm() -> Iterator[FakeLLM]:
    with running_fake_llm() as fake:
        yield fake


def hybrid(fake: FakeLLM) -> dict[str, Any]:
    """Recall's settings for the hybrid engine with ``fake`` as the embedder."""
    return {
        "engine": "hybrid",
        "embedding_model": "openai/embedder",
        "embedding_api_base": fake.base_url,
        "embedding_api_key": "sk-test",
    }


HIDDEN = "Where it was, it was at 18443."  # only stop words in English, bar the value
ASK = "So where was it?"


async def test_hybrid_recall_finds_by_embedding_where_pgvector_exists(
    pg_ledger: Ledger, fake_llm: FakeLLM
) -> None:
    recall = hybrid(fake_llm)
    # summaries are recorded, so the request is the replayed view: request_at is exact
    cfg = {"compaction_strategy": "summarize", "auto_compact": True, "recall": recall}
    session = await pg_ledger.session("h", config={"token_counter": "chars", **cfg})
    await session.add_message({"role": "user", "content": HIDDEN})
    await chatter(session, 40)
    await session.add_message({"role": "user", "content": ASK})
    sent = await session.get_messages_for_request(token_budget=3000)
    embedded = list(fake_llm.embedded)
    if await pg_ledger.store.vectors_available():  # PostgreSQL 18 with pgvector
        assert any("18443" in b for b in recall_blocks(sent))  # full-text search alone: none
        assert ASK in embedded and HIDDEN in embedded
        assert fake_llm.calls("embedder")[0].headers["authorization"] == "Bearer sk-test"
        # once per event: the next request embeds only what is new
        await session.add_message({"role": "assistant", "content": "It was there."})
        await session.add_message({"role": "user", "content": ASK + " again"})
        await session.get_messages_for_request(token_budget=3000)
        assert fake_llm.embedded[len(embedded) :] == [ASK + " again", "It was there."]  # turn first
    else:  # PostgreSQL 15: no vector extension, lexical recall only, nothing embedded
        assert not recall_blocks(sent) and embedded == []
    # a replay rebuilds the request from the ledger and never calls the embedder (a
    # summary made in the background may land after any request: compare at request_seq)
    await session.close()
    live = await session.get_messages_for_request(token_budget=3000)
    calls = len(fake_llm.embedded)
    replayed = await session.request_at(session.request_seq, token_budget=3000)
    assert replayed == live
    assert len(fake_llm.embedded) == calls


async def kestrels(
    ledger: Ledger, fake: FakeLLM, sid: str, *, max_matches: int, near: Sequence[str] = ()
) -> Session:
    """A hybrid session: the fact only the embedding finds (``HIDDEN``), then ``near``,
    then chatter with eight kestrel sightings, and the question about the kestrel."""
    recall = {**hybrid(fake), "max_matches": max_matches}
    session = await ledger.session(sid, config={"token_counter": "chars", "recall": recall})
    for text in (HIDDEN, *near):
        await session.add_message({"role": "user", "content": text})
    for i in range(8):
        await chatter(session, 4, start=10 * i)
        await session.add_message({"role": "user", "content": f"Saw a kestrel again, number {i}."})
    await session.add_message({"role": "user", "content": "So where was it, kestrel?"})
    return session


async def test_hybrid_brings_what_only_the_embedding_found_beside_lexical_matches(
    pg_ledger: Ledger, fake_llm: FakeLLM
) -> None:
    # The question shares a word with a few chatty turns (the lexical search finds them,
    # and their neighbours), and nothing but stop words with the fact, which only the
    # embedding finds: fused, the fact ranks among the first, and its message must be read
    # (a request whose lexical search had found as many messages, neighbours counted, as
    # the fused list held skipped that read and lost every embedding-only find).
    session = await kestrels(pg_ledger, fake_llm, "hk", max_matches=5)
    sent = await session.get_messages_for_request(token_budget=3000)
    (block,) = recall_blocks(sent)
    assert "kestrel" in block  # the lexical matches
    if await pg_ledger.store.vectors_available():
        assert "18443" in block  # and the embedding's
    else:  # PostgreSQL 15 here: no vector extension, the lexical matches alone
        assert "18443" not in block and fake_llm.embedded == []
    assert await session.request_at(session.request_seq, token_budget=3000) == sent


async def test_hybrid_keeps_each_ranker_s_candidates_where_the_block_has_room(
    pg_ledger: Ledger, fake_llm: FakeLLM
) -> None:
    # The lexical search's matches are noise (a word the fact does not hold), and the
    # fact is the embedding's fourth find, below three turns of nothing but stop words
    # that are nearer the question. Fused, it ranks seventh or eighth: the block has room
    # for it. Cut to ``max_matches`` (4) after the fusion, it was lost.
    near = ("So, where was it then?", "Where was it, so?", "So it was where, then?")
    session = await kestrels(pg_ledger, fake_llm, "hr", max_matches=4, near=near)
    sent = await session.get_messages_for_request(token_budget=3000)
    (block,) = recall_blocks(sent)
    assert block.count("kestrel") >= 4  # the lexical matches (and the embedding's)
    if await pg_ledger.store.vectors_available():
        assert "Where was it, so?" in block  # the embedding's first finds
        assert "18443" in block  # and its fourth
    else:  # PostgreSQL 15 here: no vector extension, the lexical matches alone
        assert "18443" not in block and fake_llm.embedded == []
    assert await session.request_at(session.request_seq, token_budget=3000) == sent


async def test_a_rollback_while_the_embedder_answers_rebuilds_the_request(
    pg_ledger: Ledger, pg_dsn: str, fake_llm: FakeLLM
) -> None:
    # The fact only the embedding finds is on a branch the session rolled away from. While
    # a request waits for its embedder, another process rolls the session back onto that
    # branch: the embedding's finds would then be read from a branch the request was not
    # planned on (the fact recalled into a request whose replay has no such branch). The
    # request is built again on the session as it is now, and replays as it was sent.
    recall = hybrid(fake_llm)
    session = await pg_ledger.session("rb", config={"token_counter": "chars", "recall": recall})
    fact = await session.add_message({"role": "user", "content": HIDDEN})
    await session.rollback(fact - 1)  # the fact is left behind
    await chatter(session, 40)
    await session.add_message({"role": "user", "content": ASK})
    rolled: list[int] = []

    def meanwhile(_texts: list[str]) -> None:
        async def rollback() -> None:
            async with Ledger.open(pg_dsn) as other:
                rolled.append(await (await other.session("rb")).rollback(fact))

        if not rolled:
            asyncio.run(rollback())  # (the embedder's thread: its own loop)

    fake_llm.on_embed = meanwhile
    sent = await session.get_messages_for_request(token_budget=3000)
    fake_llm.on_embed = None
    assert await session.request_at(session.request_seq, token_budget=3000) == sent
    if await pg_ledger.store.vectors_available():
        assert rolled and session.request_seq >= rolled[0]  # built again, on it
    else:  # PostgreSQL 15 here: nothing embedded, nothing rolled back meanwhile
        assert not rolled and not fake_llm.embedded


async def test_a_history_beyond_one_embedding_call_is_embedded_off_the_request_path(
    pg_ledger: Ledger, fake_llm: FakeLLM
) -> None:
    # A long history appended without requests: the first request embeds its turn and the
    # newest (one call), the rest is embedded in the background, and the requests after
    # that find by embedding what it held. The first request's replay does not see what
    # the background stored after it (usable from the head after its batch), nor does any
    # replay call the embedder.
    session = await pg_ledger.session(
        "bk", config={"token_counter": "chars", "recall": hybrid(fake_llm)}
    )
    await session.add_message({"role": "user", "content": HIDDEN})
    await chatter(session, EMBED_BATCH)  # twice as many messages as one call embeds
    await session.add_message({"role": "user", "content": ASK})
    first = await session.get_messages_for_request(token_budget=3000)
    first_seq = session.request_seq
    assert not any("18443" in b for b in recall_blocks(first))  # the fact: not yet embedded
    await session.close()  # lets the backlog's embedding finish
    embedded = list(fake_llm.embedded)
    vectors = await pg_ledger.store.vectors_available()
    if vectors:  # PostgreSQL 18 with pgvector
        texts = [m["content"] for m in await session.get_messages()]
        assert sorted(embedded) == sorted(texts)  # each message once, the fact among them
        request_call = fake_llm.calls("embedder")[0]
        assert len(request_call.body["input"]) == EMBED_BATCH  # one call, then none
    else:  # PostgreSQL 15: no vector extension, nothing to embed
        assert embedded == []
    await session.add_message({"role": "assistant", "content": "It was there."})
    await session.add_message({"role": "user", "content": ASK + " again"})
    second = await session.get_messages_for_request(token_budget=3000)
    assert any("18443" in b for b in recall_blocks(second)) == vectors
    calls = len(fake_llm.embedded)
    assert await session.request_at(first_seq, token_budget=3000) == first
    assert await session.request_at(session.request_seq, token_budget=3000) == second
    assert len(fake_llm.embedded) == calls


def backlog_called(fake: FakeLLM) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return len(fake.calls("embedder")) > 1  # the request's call, then the backlog's

    return check


async def test_closing_the_ledger_stops_a_backlog_s_embedding(
    pg_dsn: str, fake_llm: FakeLLM
) -> None:
    # The backlog's embedder hangs: the ledger's close does not wait for it (however long
    # it would wait for a summary), it cancels it; the next request would start it again.
    release = threading.Event()
    fake_llm.on_embed = lambda texts: None if ASK in texts else release.wait(60)
    try:
        ledger = await Ledger.open(pg_dsn)
        ledger.close_timeout = 600.0
        session = await ledger.session("bc", config={"recall": hybrid(fake_llm)})
        await chatter(session, EMBED_BATCH)
        await session.add_message({"role": "user", "content": ASK})
        await session.get_messages_for_request(token_budget=3000)
        vectors = await ledger.store.vectors_available()
        if vectors:
            await until(backlog_called(fake_llm), "the backlog's call")  # (it hangs)
        await asyncio.wait_for(ledger.close(), 60)  # (not the 600 s of close_timeout)
    finally:
        release.set()
    if not vectors:  # PostgreSQL 15: nothing embedded, no backlog
        assert fake_llm.embedded == []
        return
    async with Ledger.open(pg_dsn) as again:  # the backlog stored nothing: all but the
        left = await again.store.unembedded(  # request's one call are left
            "bc", "openai/embedder", upto_seq=10**6, first=(), limit=10**6
        )
    assert len(left) == EMBED_BATCH + 1  # 2 x 128 chatter + the turn, less the request's


async def test_resumable_work_kept_while_the_ledger_closes_is_cancelled() -> None:
    # A request still in flight when close began may start a backlog after close
    # cancelled the ones it knew of: that one is cancelled as it is kept.
    ledger = await Ledger.open("memory://")
    release = asyncio.Event()
    summary = asyncio.ensure_future(release.wait())  # close waits for this one
    ledger.keep(summary)
    closing = asyncio.ensure_future(ledger.close())
    await asyncio.sleep(0)  # close is waiting for the summary now
    late = asyncio.ensure_future(asyncio.sleep(3600))
    ledger.keep(late, resumable=True)
    release.set()
    await closing
    await asyncio.wait([late], timeout=30)  # (a bound: it would sleep an hour)
    assert late.cancelled()


async def test_work_kept_while_the_ledger_closes_lands_before_it_closes() -> None:
    # A summary kept by a request still in flight after close took its list of work in
    # flight: close waits for it too (it used to close the store under it).
    ledger = await Ledger.open("memory://")
    release = asyncio.Event()
    first = asyncio.ensure_future(release.wait())
    ledger.keep(first)
    closing = asyncio.ensure_future(ledger.close())
    await asyncio.sleep(0)  # close is waiting for the first one now
    landed: list[str] = []

    async def summary() -> None:
        await asyncio.sleep(0.05)
        landed.append("summary")

    ledger.keep(asyncio.ensure_future(summary()))
    release.set()
    await closing
    assert landed == ["summary"]


async def test_a_backlog_stored_for_a_session_purged_meanwhile_is_dropped(
    pg_dsn: str,
) -> None:
    async with Ledger.open(pg_dsn) as ledger:
        store = ledger.store
        session = await ledger.session("p")
        for text in ("one", "two"):  # seqs 2 and 3 (1 made the session)
            await session.add_message({"role": "user", "content": text})
        one = Recalled(2, {"role": "user", "content": "one"})
        two = Recalled(3, {"role": "user", "content": "two"})
        if not await store.vectors_available():  # PostgreSQL 15: no table to keep them in
            with pytest.raises(LedgerRefused):
                await store.store_embeddings_behind("p", "m", [(one, [1.0, 0.0])])
            return
        assert await store.store_embeddings_behind("p", "m", [(one, [1.0, 0.0]), (two, [1.0, 0.1])])
        near: dict[str, Any] = {"exclude": {3}, "branch": None, "limit": 5}
        # usable after the head they were stored at (3), not at it
        assert await store.vector_search("p", "m", 3, upto_seq=3, **near) == []
        await session.add_message({"role": "user", "content": "three"})
        found = await store.vector_search("p", "m", 3, upto_seq=4, **near)
        assert [seq for seq, _ in found] == [2]
        await store.purge("p", "test")  # type: ignore[attr-defined]
        three = Recalled(4, {"role": "user", "content": "three"})
        assert not await store.store_embeddings_behind("p", "m", [(three, [0.0, 1.0])])
        # made again under its id: the purged session's vectors are not its messages'
        again = await ledger.session("p")
        await again.add_message({"role": "user", "content": "other"})
        assert await store.store_embeddings_behind("p", "m", [(one, [1.0, 0.0])])
        await store.store_embeddings("p", "m", 2, [(one, [1.0, 0.0])])
    conn = await asyncpg.connect(asyncpg_dsn(pg_dsn))
    try:
        assert await conn.fetchval("SELECT count(*) FROM contextledger.event_embeddings") == 0
    finally:
        await conn.close()


async def test_a_session_purged_and_made_again_while_the_backlog_embeds_keeps_no_old_vector(
    pg_dsn: str, fake_llm: FakeLLM
) -> None:
    # Between the backlog's read of the messages and its store, another process purges
    # the session and makes it again under its id, with other messages at the same seqs:
    # the vectors of the purged text are not stored as theirs.
    recall = {"recall": hybrid(fake_llm)}
    swapped: list[int] = []

    def meanwhile(texts: list[str]) -> None:
        async def swap() -> None:
            async with Ledger.open(pg_dsn) as other:
                await other.store.purge("pr", "asked")  # type: ignore[attr-defined]
                fresh = await other.session("pr")
                await chatter(fresh, EMBED_BATCH + 1, start=1000)
                swapped.append(fresh.head)

        if ASK not in texts and not swapped:  # the backlog's call, not the request's
            asyncio.run(swap())

    async with Ledger.open(pg_dsn) as ledger:
        session = await ledger.session("pr", config=recall)
        await chatter(session, EMBED_BATCH)
        await session.add_message({"role": "user", "content": ASK})
        fake_llm.on_embed = meanwhile
        await session.get_messages_for_request(token_budget=3000)
        await session.close()  # the backlog's end
        fake_llm.on_embed = None
        if not await ledger.store.vectors_available():  # PostgreSQL 15: nothing embedded
            assert fake_llm.embedded == [] and not swapped
            return
        assert swapped
    conn = await asyncpg.connect(asyncpg_dsn(pg_dsn))
    try:  # every vector kept is the one of the message its seq holds now
        rows = await conn.fetch(
            "SELECT e.data -> 'message' ->> 'content', x.embedding::text"
            " FROM contextledger.event_embeddings x"
            " JOIN contextledger.events e ON e.session_id = x.session_id AND e.seq = x.seq"
        )
    finally:
        await conn.close()
    assert rows  # (the new session's messages, embedded by the backlog after the swap)
    for content, stored in rows:
        vector = json.loads(stored)
        assert max(map(abs, map(operator.sub, vector, hashed_embedding(content)))) < 1e-5


async def test_hybrid_recall_on_memory_is_lexical(fake_llm: FakeLLM) -> None:
    recall = {"engine": "hybrid", "embedding_model": "openai/e", "embedding_api_base": "x"}
    async with Ledger.open("memory://") as ledger:
        session = await planted(ledger, {"recall": recall})
        request = await session.get_messages_for_request(token_budget=2000)
    assert any("18443" in b for b in recall_blocks(request))
    assert fake_llm.embedded == []


async def test_a_failing_embedder_leaves_lexical_recall(pg_ledger: Ledger) -> None:
    recall = {
        "engine": "hybrid",
        "embedding_model": "openai/embedder",
        "embedding_api_base": "http://127.0.0.1:9/v1",  # nothing listens there
        "embedding_api_key": "k",
    }
    session = await planted(pg_ledger, {"recall": recall})
    request = await session.get_messages_for_request(token_budget=2000)
    assert any("18443" in b for b in recall_blocks(request))


@pytest.mark.parametrize("checkpoints", [0, MAX_GATE_GAPS + 1])
@pytest.mark.parametrize("left_out", ["oldest", "middle", "newest", "none"])
async def test_the_search_finds_a_fact_in_any_part_the_request_left_out(
    ledger: Ledger, left_out: str, checkpoints: int
) -> None:
    # The search skips its work when the request carries every message of the branch; a
    # fact left out anywhere (before, between or after what is carried) must still be
    # found, and nothing may come back when nothing was left out. Checkpoints are seqs no
    # request carries: past MAX_GATE_GAPS of them the gate opens without probing them.
    session = await ledger.session(
        f"gap-{left_out}-{checkpoints}", config={"token_counter": "chars"}
    )
    seqs = []
    for i in range(9):
        text = FACT if i == 4 else f"step {i}: please tidy the caching module"
        seqs.append(await session.add_message({"role": "user", "content": text}))
        if i == 2:
            for _ in range(checkpoints):
                await session.checkpoint()
    carried = {
        "oldest": seqs[5:],  # the fact lies before the oldest message carried
        "middle": seqs[:4] + seqs[5:],  # in a gap between carried messages
        "newest": seqs[:4],  # after the newest carried
        "none": seqs,
    }[left_out]
    found = await session._store.search(
        session.session_id,
        QUESTION,
        exclude=set(carried),
        upto_seq=session.head,
        branch=None,
        limit=8,
        text_config="english",
    )
    assert [s for s, _ in found] == ([] if left_out == "none" else [seqs[4]])


async def test_the_search_reads_its_matches_messages_as_recall_messages_does(
    ledger: Ledger,
) -> None:
    # A request's recall is one statement on PostgreSQL (the matches come with their
    # messages): the same messages, tokens and order as the two reads it replaced, live
    # and in a replay of the branch after a rollback, which left the fact out.
    session = await planted(ledger)
    point = await session.checkpoint("later")
    abandoned = await session.add_message(
        {"role": "user", "content": "orchard-api staging gateway: 18443?"}
    )
    await session.rollback(point)
    await session.add_message({"role": "user", "content": QUESTION})
    store, sid = session._store, session.session_id
    branch = [e.seq async for e in session.events() if e.type == "message.appended"]
    branch.remove(abandoned)
    for replayed in (None, branch):
        args: dict[str, Any] = {
            "exclude": set(branch[-6:]),
            "upto_seq": session.head,
            "branch": replayed,
            "limit": 8,
            "text_config": "english",
        }
        found, messages = await store.search_messages(sid, QUESTION, **args)
        assert found == await store.search(sid, QUESTION, **args)
        assert found and abandoned not in [seq for seq, _ in found]
        seqs = [seq for seq, _ in found]
        # the matches and the neighbours of the best ones, as recall_messages reads them
        near = neighbours(seqs, session.head, args["exclude"])
        expected = await store.recall_messages(
            sid, seqs + near, upto_seq=session.head, branch=replayed
        )
        assert messages == expected
        assert set(seqs) <= {m.seq for m in messages} <= set(seqs) | set(near)
        assert [m.seq for m in messages] == sorted(m.seq for m in messages)
        assert any("18443" in str(m.message["content"]) for m in messages)
        assert all(m.tokens > 0 for m in messages)


# -- the search postings (migrations 0006, 0010): written by the search, not by appends -


async def indexed(ledger: Ledger, dsn: str, session_id: str) -> list[int]:
    """The seqs whose postings are stored, once what the searches so far found missing
    is (the warm path stores it after the request)."""
    await ledger.store.wait_indexed()
    return await stored(dsn, session_id)


async def stored(dsn: str, session_id: str) -> list[int]:
    """The seqs whose postings are stored now (nothing waited for)."""
    conn = await asyncpg.connect(asyncpg_dsn(dsn))
    try:
        rows = await conn.fetch(
            "SELECT seq FROM contextledger.event_terms WHERE session_id = $1 AND lexeme = ''"
            " ORDER BY seq",
            session_id,
        )
        return [r[0] for r in rows]
    finally:
        await conn.close()


async def message_seqs(session: Session) -> list[int]:
    return [e.seq async for e in session.events() if e.type == "message.appended"]


async def test_appends_write_no_vectors_and_each_search_indexes_what_is_new(
    pg_ledger: Ledger, pg_dsn: str
) -> None:
    session = await planted(pg_ledger)
    assert await indexed(pg_ledger, pg_dsn, "r") == []
    request = await session.get_messages_for_request(token_budget=2000)
    assert any("18443" in b for b in recall_blocks(request))
    assert await indexed(pg_ledger, pg_dsn, "r") == await message_seqs(session)
    await session.add_message({"role": "assistant", "content": "Checking the gateway now."})
    await session.add_message({"role": "user", "content": "And the orchard-api owner?"})
    assert len(await indexed(pg_ledger, pg_dsn, "r")) == len(await message_seqs(session)) - 2
    await session.get_messages_for_request(token_budget=2000)
    assert await indexed(pg_ledger, pg_dsn, "r") == await message_seqs(session)


async def test_a_short_session_skips_the_search_until_something_may_be_left_out(
    pg_ledger: Ledger, pg_dsn: str
) -> None:
    # While every request carries the whole branch, a closed gate is remembered and the
    # search (and its indexing) skipped; a seq newly left out, or RECHECK_AFTER seqs,
    # make it run again, and a fact pushed out of the budget is still recalled.
    session = await pg_ledger.session("short", config={"token_counter": "chars"})
    await session.add_message({"role": "user", "content": FACT})
    await session.add_message({"role": "assistant", "content": "Noted."})
    await session.get_messages_for_request(token_budget=100_000)
    assert await indexed(pg_ledger, pg_dsn, "short") == await message_seqs(session)  # searched
    first = await indexed(pg_ledger, pg_dsn, "short")
    await chatter(session, 3)
    await session.get_messages_for_request(token_budget=100_000)
    assert await indexed(pg_ledger, pg_dsn, "short") == first  # skipped: nothing can be left out
    await session.checkpoint("c")  # a seq no request carries: the gate is probed again
    await session.get_messages_for_request(token_budget=100_000)
    assert await indexed(pg_ledger, pg_dsn, "short") == await message_seqs(session)
    for i in range(RECHECK_AFTER // 2 + 1):  # skipped at most RECHECK_AFTER seqs
        await chatter(session, 1, start=10 + i)
        await session.get_messages_for_request(token_budget=100_000)
    assert len(await indexed(pg_ledger, pg_dsn, "short")) >= len(await message_seqs(session)) - 2
    await chatter(session, 40, start=100)  # the fact falls out of a small budget
    await session.add_message({"role": "user", "content": QUESTION})
    blocks = recall_blocks(await session.get_messages_for_request(token_budget=2000))
    assert len(blocks) == 1 and FACT in blocks[0]


async def test_a_session_purged_and_recreated_elsewhere_is_searched_again(
    pg_ledger: Ledger, pg_dsn: str
) -> None:
    # This process remembers a closed gate at seq 6; another process purges the session
    # and re-creates it under the same id, its fact at seq 2 where a checkpoint was. The
    # new chain is not the one the closed search saw: the fact must be recalled.
    session = await pg_ledger.session("again", config={"token_counter": "chars"})
    await session.checkpoint("c")
    for i in range(4):
        await session.add_message({"role": "user", "content": f"hello {i}"})
    await session.get_messages_for_request(token_budget=100_000)
    async with Ledger.open(pg_dsn) as other:
        await other.store.purge("again", "test")
        twin = await other.session("again", config={"token_counter": "chars"})
        await twin.add_message({"role": "user", "content": FACT})
        for i in range(3):
            filler = f"ok {i} " + "tidy the cache module " * 40
            await twin.add_message({"role": "user", "content": filler})
        await twin.add_message({"role": "user", "content": QUESTION})
    mine = await pg_ledger.session("again")
    await mine.refresh()
    blocks = recall_blocks(await mine.get_messages_for_request(token_budget=840))
    assert len(blocks) == 1 and FACT in blocks[0]


async def test_concurrent_searches_agree_and_index_each_event_once(
    pg_ledger: Ledger, pg_dsn: str
) -> None:
    session = await planted(pg_ledger)
    store = pg_ledger.store
    head = (await store.session_info("r")).head

    async def search() -> list[tuple[int, float]]:
        return await store.search(
            "r",
            QUESTION,
            exclude=(head,),
            upto_seq=head,
            branch=None,
            limit=5,
            text_config="english",
        )

    results = await asyncio.gather(*(search() for _ in range(6)))
    assert results[0] and results[0][0][0] == 3 and all(r == results[0] for r in results)
    once_each = await message_seqs(session)  # (the primary key)
    assert await indexed(pg_ledger, pg_dsn, "r") == once_each
    assert await search() == results[0]  # from the stored vectors alone


async def test_a_read_only_server_searches_the_same_without_storing(
    pg_ledger: Ledger, pg_dsn: str
) -> None:
    await planted(pg_ledger)
    head = (await pg_ledger.store.session_info("r")).head
    pool = await asyncpg.create_pool(
        asyncpg_dsn(pg_dsn), server_settings={"default_transaction_read_only": "on"}
    )
    async with pool.acquire() as conn:  # what ``PostgresStore.connect`` learns at start
        citus = await distributed.probe(conn)
    standby = PostgresStore(pool, pg_dsn, citus=citus)
    args: dict[str, Any] = {
        "exclude": (head,),  # the question itself
        "upto_seq": head,
        "branch": None,
        "limit": 5,
        "text_config": "english",
    }
    try:
        found = await standby.search("r", QUESTION, **args)
    finally:
        await standby.close()
    assert found and found[0][0] == 3
    assert await indexed(pg_ledger, pg_dsn, "r") == []
    assert await pg_ledger.store.search("r", QUESTION, **args) == found


async def test_each_tenant_indexes_and_searches_only_its_own_events(pg_dsn: str) -> None:
    role = "contextledger_service"
    async with Ledger.open(pg_dsn, tenant="acme", role=role) as acme:
        mine = await planted(acme)
        request = await mine.get_messages_for_request(token_budget=2000)
        assert any("18443" in b for b in recall_blocks(request))  # stored under RLS
        acme_messages = len(await message_seqs(mine))
    async with Ledger.open(pg_dsn, tenant="other", role=role) as other:
        theirs = await other.session("r", config={"token_counter": "chars"})
        await theirs.add_message({"role": "user", "content": "orchard-api is not ours"})
        await chatter(theirs, 40)
        await theirs.add_message({"role": "user", "content": QUESTION})
        request = await theirs.get_messages_for_request(token_budget=2000)
        assert "18443" not in str(request)
    conn = await asyncpg.connect(asyncpg_dsn(pg_dsn))
    try:
        counts = dict(
            await conn.fetch(
                "SELECT tenant_id, count(*) FROM contextledger.event_terms WHERE lexeme = ''"
                " GROUP BY 1"
            )
        )
        # The service role, its tenant set per transaction as the store sets it (on Citus
        # only a transaction's SET LOCAL reaches the workers, where the policy runs).
        beta = await asyncpg.connect(asyncpg_dsn(pg_dsn), server_settings={"role": role})

        async def count(tenant: str, sql: str) -> int:
            async with beta.transaction():
                await beta.execute(f"SET LOCAL contextledger.tenant = '{tenant}'")
                found: int = await beta.fetchval(sql)
                return found

        try:
            assert await count("nobody", "SELECT count(*) FROM contextledger.event_terms") == 0
            matches = (
                "SELECT count(*) FROM contextledger.event_terms"
                " WHERE session_id = 'r' AND lexeme = '18443'"
            )
            assert await count("nobody", matches) == 0
            assert await count("other", matches) == 0  # the same session id, another tenant
            assert await count("acme", matches) == 1
        finally:
            await beta.close()
    finally:
        await conn.close()
    assert counts == {"acme": acme_messages, "other": 82}


def _postings_read(plan: Any) -> int:
    """Index tuples the plan's scans of ``event_terms`` returned, over all their loops."""
    total = 0
    stack = [plan]
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            stack.extend(node)
        elif isinstance(node, dict):
            if node.get("Index Name") == "event_terms_pkey" and "Actual Rows" in node:
                total += int(node["Actual Rows"] * node.get("Actual Loops", 1))
            stack.extend(node.values())
    return total


def _events_read(plan: Any) -> int:
    """Rows the plan's scans of ``events`` read (returned or filtered out), over all loops."""
    total = 0
    stack = [plan]
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            stack.extend(node)
        elif isinstance(node, dict):
            if node.get("Relation Name") == "events" and "Actual Rows" in node:
                rows = node["Actual Rows"] + node.get("Rows Removed by Filter", 0)
                total += int(rows * node.get("Actual Loops", 1))
            stack.extend(node.values())
    return total


@pytest.mark.usefixtures("serial_migrations")
async def test_the_search_reads_postings_bounded_by_the_query_not_the_history() -> None:
    """0010: a query lexeme's postings are read newest first, at most ``PER_TERM`` of them
    (``DEEP_LIMIT`` for the rarest capped ones), through the key: a word in every message
    of a long session costs a search what it costs in a shorter one (a GIN lookup
    returned every match). Events are read by key too, in the live search's generic plan,
    also before the table's first ANALYZE (a young deployment): there the catch-up's
    ``seq = ANY(...)`` was a filter over every event of the session."""
    from contextledger.store.base import SearchQuery
    from contextledger.store.lexical import DEEP_LIMIT, PER_TERM
    from contextledger.store.postgres import search_statement

    reads: list[int] = []
    events: list[int] = []
    async with scratch_database() as dsn, Ledger.open(dsn, migrate=True) as ledger:
        conn = await asyncpg.connect(asyncpg_dsn(dsn))
        try:  # statistics stay as a new table's (autovacuum would analyze it some time)
            await conn.execute("ALTER TABLE contextledger.events SET (autovacuum_enabled = off)")
        finally:
            await conn.close()
        for n in (DEEP_LIMIT + 200, 3 * DEEP_LIMIT):
            session = await ledger.session(f"b{n}", config={"token_counter": "chars"})
            batch = [
                {"role": "user", "content": f"the gateway answered on attempt {i} quickly"}
                for i in range(n)
            ]
            await session.add_messages(batch)
            await session.add_message({"role": "user", "content": "which gateway attempt?"})
            request = await session.get_messages_for_request(token_budget=2000)
            assert recall_blocks(request)  # the search found matches
            await ledger.store.wait_indexed()  # and stored their postings
            carried = set(range(n - 5, n + 2))
            text, args = search_statement(
                SearchQuery(f"b{n}", "which gateway attempt?", carried, n + 1, None, 40, "english"),
                None,
            )
            conn = await asyncpg.connect(asyncpg_dsn(dsn))
            try:
                async with conn.transaction():
                    # the live search's plan: generic (``_LIVE_SEARCH_SETTINGS``)
                    await conn.execute("SET LOCAL plan_cache_mode = force_generic_plan")
                    await conn.execute("SET LOCAL enable_seqscan = off")
                    plan = json.loads(
                        await conn.fetchval("EXPLAIN (ANALYZE, FORMAT JSON) " + text, *args)
                    )
            finally:
                await conn.close()
            reads.append(_postings_read(plan))
            events.append(_events_read(plan))
    # two lexemes (gateway, attempt), each read to the cap, then (the rarest capped ones)
    # further to the deep cap, plus the catch-up's marker step: the same at both lengths
    assert reads[0] == reads[1]
    assert DEEP_LIMIT <= reads[1] <= 2 * (PER_TERM + DEEP_LIMIT) + 2
    # events by key: the matches and their neighbours (nothing was left to catch up)
    assert events[0] == events[1] <= 3 * 40


@pytest.mark.usefixtures("serial_migrations")
async def test_the_postings_migration_moves_the_vectors_and_downgrades(pg_dsn: str) -> None:
    """0010 moves 0006's vectors into postings (no message parsed again) and drops the GIN
    index and its functions; a downgrade restores 0009's schema, and upgrading again
    leaves a search that still finds the planted fact."""
    from alembic import command

    from contextledger.store.migrate import alembic_config

    async with scratch_database() as dsn:
        async with Ledger.open(dsn, migrate=True) as ledger:
            await (await planted(ledger)).get_messages_for_request(token_budget=2000)
        conn = await asyncpg.connect(asyncpg_dsn(dsn))
        try:
            markers = "SELECT count(*) FROM contextledger.event_terms WHERE lexeme = ''"
            before = await conn.fetchval(markers)
            assert before > 0
            await asyncio.to_thread(command.downgrade, alembic_config(dsn), "0009")
            assert await conn.fetchval("SELECT to_regclass('contextledger.event_terms')") is None
            assert await conn.fetchval("SELECT to_regproc('contextledger.session_matches')")
            await conn.execute(
                "INSERT INTO contextledger.event_search (session_id, seq, search)"
                " VALUES ('r', 3, to_tsvector('english', 'orchard-api binds 18443'))"
            )
            await upgrade(dsn)
            assert await conn.fetchval("SELECT to_regclass('contextledger.event_search')") is None
            assert await conn.fetchval("SELECT to_regproc('contextledger.session_matches')") is None
            moved = await conn.fetchval(
                "SELECT count(*) FROM contextledger.event_terms"
                " WHERE session_id = 'r' AND seq = 3 AND lexeme = '18443'"
            )
            assert moved == 1
            purge = await conn.fetchval(
                "SELECT prosrc FROM pg_proc WHERE proname = 'purge_session'"
            )
            assert "event_terms" in purge and "event_search" not in purge
        finally:
            await conn.close()
        async with Ledger.open(dsn) as ledger:
            session = await ledger.session("r")
            request = await session.get_messages_for_request(token_budget=2000)
            assert any("18443" in b for b in recall_blocks(request))


@pytest.mark.usefixtures("serial_migrations")
async def test_a_postings_length_is_the_message_in_tokens_and_0015_sets_the_old_rows(
    pg_dsn: str,
) -> None:
    """BM25's ``dl`` is a message's length in tokens: a message repeating one sentence
    five times is five times as long, not as long as the sentence (0010 stored the
    distinct lexemes, and such a message outranked the one that said a thing once).
    0015 sets the rows written before it; its downgrade (to 0013) restores the old lengths."""
    from alembic import command

    from contextledger.store.migrate import alembic_config

    lengths = (
        "SELECT seq, min(dl), sum(tf), count(*) - 1 FROM contextledger.event_terms"
        " WHERE session_id = 'len' GROUP BY seq ORDER BY seq"
    )
    async with scratch_database() as dsn:
        async with Ledger.open(dsn, migrate=True) as ledger:
            session = await ledger.session("len", create=True)
            await session.add_message({"role": "user", "content": "wren notifier owner. " * 5})
            await session.add_message({"role": "user", "content": "owner of wren notifier?"})
            await session.get_messages_for_request()
        conn = await asyncpg.connect(asyncpg_dsn(dsn))
        try:
            rows = await conn.fetch(lengths)
            assert [(r[1], r[2], r[3]) for r in rows] == [(15, 15, 3), (3, 3, 3)]
            await asyncio.to_thread(command.downgrade, alembic_config(dsn), "0013")
            assert [r[1] for r in await conn.fetch(lengths)] == [3, 3]
            await upgrade(dsn)
            assert [r[1] for r in await conn.fetch(lengths)] == [15, 3]
        finally:
            await conn.close()


@pytest.mark.usefixtures("serial_migrations")
async def test_the_search_reads_each_match_by_its_key(pg_dsn: str) -> None:
    """The matches' messages are read by primary key, the seq an index condition: as a
    join the generic plan scanned all the session's events for each match (44 of a 45 ms
    search on bench/recall.py). Both searches: the warm path's read of the matches, and
    the one statement (Citus, other text configurations) with the same query."""
    from contextledger.store.base import SearchQuery
    from contextledger.store.postgres.search import search_statement

    captured: list[tuple[str, list[Any]]] = []
    async with scratch_database() as dsn:
        async with Ledger.open(dsn, migrate=True) as ledger:
            session = await planted(ledger)
            store = ledger.store
            assert isinstance(store, PostgresStore)
            run = store._run_search

            async def spy(text: str, args: Any, *, live: bool) -> Any:
                captured.append((text, list(args)))
                return await run(text, args, live=live)

            store._run_search = spy  # type: ignore[method-assign]
            request = await session.get_messages_for_request(token_budget=2000)
            assert any("18443" in b for b in recall_blocks(request))
            head = (await store.session_info("r")).head
        ((read, read_args),) = [c for c in captured if " g(seq) " in c[0]]
        query = SearchQuery("r", "notifier port?", (), head, None, 10, "english")
        one, one_args = search_statement(query, None)
        conn = await asyncpg.connect(
            asyncpg_dsn(dsn), server_settings={"plan_cache_mode": "force_generic_plan"}
        )
        try:
            plans = [
                "\n".join(r[0] for r in await conn.fetch("EXPLAIN " + text, *args))
                for text, args in ((read, read_args), (one, one_args))
            ]
        finally:
            await conn.close()
    read_plan, one_plan = (p.splitlines() for p in plans)
    assert any("Index Cond" in line and "(seq = g.seq)" in line for line in read_plan), plans[0]
    assert any("Index Cond" in line and "(seq = top.seq)" in line for line in one_plan), plans[1]
    assert not any("Filter" in line and "top.seq" in line for line in one_plan), plans[1]


async def test_a_purge_removes_the_vectors(pg_ledger: Ledger, pg_dsn: str) -> None:
    session = await planted(pg_ledger)
    await session.get_messages_for_request(token_budget=2000)
    assert await indexed(pg_ledger, pg_dsn, "r")
    await pg_ledger.store.purge("r", "test")
    assert await indexed(pg_ledger, pg_dsn, "r") == []


@pytest.mark.usefixtures("serial_migrations")
async def test_migration_0006_moves_the_vectors_and_downgrades(pg_dsn: str) -> None:
    from alembic import command

    from contextledger.store.migrate import alembic_config

    async with scratch_database() as dsn:
        await upgrade(dsn, "0005")
        await _old_session(dsn)
        vector = "SELECT search::text FROM contextledger.{} WHERE session_id = 'old' AND seq = 2"
        conn = await asyncpg.connect(asyncpg_dsn(dsn))
        try:
            before = await conn.fetchval(vector.format("events"))
            await upgrade(dsn, "0006")
            assert await conn.fetchval(vector.format("event_search")) == before  # copied
            assert "18443" in before
            columns = await conn.fetch(
                "SELECT column_name FROM information_schema.columns"
                " WHERE table_schema = 'contextledger' AND table_name = 'events'"
            )
            assert "search" not in {c[0] for c in columns}
            await asyncio.to_thread(command.downgrade, alembic_config(dsn), "0005")
            assert await conn.fetchval(vector.format("events")) == before  # recomputed
            assert await conn.fetchval("SELECT to_regclass('contextledger.event_search')") is None
            purge = await conn.fetchval(
                "SELECT prosrc FROM pg_proc WHERE proname = 'purge_session'"
            )
            assert "event_search" not in purge
            await upgrade(dsn, "0006")
            assert await conn.fetchval(vector.format("event_search")) == before
        finally:
            await conn.close()


@pytest.mark.usefixtures("serial_migrations")
async def test_an_application_role_with_table_grants_recalls_under_row_level_security(
    pg_dsn: str,
) -> None:
    """An application role with table grants only (or a custom service role) searches the
    postings through their key with row-level security applying (``=`` on text is
    leakproof, so the policy does not keep the index out), and recalls what the owner
    does."""
    role = f"cl_app_{uuid.uuid4().hex[:6]}"
    async with scratch_database() as dsn:
        async with Ledger.open(dsn, migrate=True):
            pass
        conn = await asyncpg.connect(asyncpg_dsn(dsn))
        try:
            for statement in (
                f"CREATE ROLE {role} LOGIN",
                f"GRANT USAGE ON SCHEMA contextledger TO {role}",
                f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA contextledger"
                f" TO {role}",
                f"GRANT USAGE ON ALL SEQUENCES IN SCHEMA contextledger TO {role}",
            ):
                await conn.execute(statement)
            app = dsn.replace("postgres@", f"{role}@")
            async with Ledger.open(app) as ledger:
                session = await planted(ledger)
                as_app = await session.get_messages_for_request(token_budget=2000)
            async with Ledger.open(dsn) as ledger:
                session = await ledger.session("r")
                as_owner = await session.get_messages_for_request(token_budget=2000)
            assert any("18443" in b for b in recall_blocks(as_app))
            assert recall_blocks(as_owner) == recall_blocks(as_app)
        finally:
            await conn.close()
    admin = await asyncpg.connect(host=PG_HOST, port=PG_PORT, user="postgres", database="postgres")
    try:
        await admin.execute(f"DROP ROLE {role}")
    finally:
        await admin.close()


async def test_the_store_counts_its_search_connections(pg_dsn: str) -> None:
    """Live searches open connections of their own; the store's count (the service's
    pool metric) includes them, and a store without a database has none (on Citus too:
    the search with its catch-up is one delegated call, migration 0018)."""
    async with Ledger.open(pg_dsn, pool_size=4) as ledger:
        before = ledger.store.connections()
        assert before is not None and before[0] >= 1
        session = await planted(ledger)
        await session.get_messages_for_request(token_budget=2000)  # a live search
        main = ledger.store._pool.get_size()  # type: ignore[attr-defined]
        opened, idle = ledger.store.connections()  # type: ignore[misc]
        assert opened == main + 1 and 0 <= idle <= opened
    async with Ledger.open("memory://") as memory:
        assert memory.store.connections() is None


# -- room for what is asked (RecallConfig.max_share) ----------------------------------


async def test_a_question_lets_recall_take_more_room_and_gives_back_what_it_leaves(
    ledger: Ledger,
) -> None:
    """A question about the past may take up to ``max_share`` of the request from the
    view's oldest part (the recent part stays); what the block leaves unused comes back
    to the view, so the request is as full as without widening; a statement does not
    widen; and request_at rebuilds each request."""
    facts = [
        f"Heads up: service{i:02d} binds to port {18400 + i} on staging, behind the shared"
        " load balancer of the east region, as the runbook says."
        for i in range(12)
    ]
    session = await ledger.session("w", config={"token_counter": "chars"})
    for i, fact in enumerate(facts):
        await session.add_message({"role": "user", "content": fact})
        await session.add_message({"role": "assistant", "content": "Noted."})
        await chatter(session, 3, start=10 * i)
    budget = 2000
    asked = "Which ports do " + " ".join(f"service{i:02d}" for i in range(10)) + " bind to?"
    await session.add_message({"role": "user", "content": asked})
    wide = await session.get_messages_for_request(token_budget=budget)
    assert await session.request_at(session.request_seq, token_budget=budget) == wide
    narrow_config = {"token_counter": "chars", "recall": {"max_share": 0.15}}
    other = await ledger.session("n", config=narrow_config)
    async for event in session.events():
        if event.type == "message.appended":
            await other.add_message(dict(event.payload.message))  # type: ignore[attr-defined]
    narrow = await other.get_messages_for_request(token_budget=budget)

    def recalled(request: list[dict[str, Any]]) -> int:
        return sum(f"port {18400 + i}" in json.dumps(request) for i in range(10))

    assert recalled(wide) == 10 > recalled(narrow)
    wide_block = len("".join(recall_blocks(wide)))
    assert wide_block > len("".join(recall_blocks(narrow)))
    # the latest turns stay in both; the widened request is as full (what it left, back)
    assert wide[-1]["content"] == asked and narrow[-1]["content"] == asked
    assert sum(len(str(m["content"])) for m in wide) >= 0.9 * sum(
        len(str(m["content"])) for m in narrow
    )
    # a statement does not widen: the share is the usual one
    await session.add_message({"role": "assistant", "content": "Let me look."})
    await session.add_message({"role": "user", "content": "Deploy service00 then."})
    plain = await session.get_messages_for_request(token_budget=budget)
    assert len("".join(recall_blocks(plain))) < wide_block
    assert await session.request_at(session.request_seq, token_budget=budget) == plain


async def walked(
    session: Session, steps: list[tuple[str, int]], budget: int, fact: str, question: str
) -> list[tuple[int, list[dict[str, Any]]]]:
    """``steps`` on ``session`` (facts, chatter, questions, statements, rollbacks); each
    turn's request, with the seq ``request_at`` rebuilds it at."""
    await session.add_message({"role": "system", "content": "You are a careful agent."})
    sent: list[tuple[int, list[dict[str, Any]]]] = []
    for kind, n in steps:
        if kind == "fact":
            text = fact.format(n=n, port=9000 + n)
            await session.add_message({"role": "user", "content": text})
        elif kind == "chatter":
            await chatter(session, 1 + n % 4, start=n)
        elif kind == "rollback":
            await session.rollback(max(2, session.head - 1 - n))
        else:
            text = question.format(n=n) if kind == "question" else f"Restart {n}."
            await session.add_message({"role": "user", "content": text})
            request = await session.get_messages_for_request(token_budget=budget)
            sent.append((session.request_seq, request))
            await session.add_message({"role": "assistant", "content": "On it."})
    return sent


@settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["fact", "chatter", "question", "statement"]), st.integers(0, 30)
        ),
        min_size=3,
        max_size=14,
    ),
    st.integers(400, 3000),
)
async def test_request_at_reproduces_every_recall_block_widened_or_not(
    ledger: Ledger, steps: list[tuple[str, int]], budget: int
) -> None:
    session = await ledger.session(f"p{uuid.uuid4().hex[:8]}", config={"token_counter": "chars"})
    sent = await walked(
        session, steps, budget, "service{n} binds to {port}.", "Which port does service{n} use?"
    )
    for seq, request in sent:
        assert await session.request_at(seq, token_budget=budget) == request


@settings(
    max_examples=examples(30),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["fact", "chatter", "question", "statement", "rollback"]),
            st.integers(0, 30),
        ),
        min_size=3,
        max_size=14,
    ),
    st.integers(400, 3000),
)
async def test_request_at_reproduces_every_hybrid_block_across_rollbacks(
    pg_ledger: Ledger, fake_llm: FakeLLM, steps: list[tuple[str, int]], budget: int
) -> None:
    # The embedding's finds, fused with the lexical ones, read by key, on branches that
    # rollbacks replace: every request replays as it was sent (a replay never embeds).
    config = {"token_counter": "chars", "recall": hybrid(fake_llm)}
    session = await pg_ledger.session(f"h{uuid.uuid4().hex[:8]}", config=config)
    fact, question = "Where it was, service{n} was at {port}.", "So where was it, service{n}?"
    sent = await walked(session, steps, budget, fact, question)
    embedded = len(fake_llm.embedded)
    for seq, request in sent:
        assert await session.request_at(seq, token_budget=budget) == request
    assert len(fake_llm.embedded) == embedded


# -- the search as a function (migration 0018: what the store calls on Citus) ----------


async def test_the_search_function_answers_as_the_store_s_statement(pg_dsn: str) -> None:
    """``contextledger.search_messages`` runs the store's search statement (with its
    catch-up): the same rows as the statement, live and a replay's, with a second hop or
    not; it stores the postings it indexed; it prepares the statement once per
    connection (on plain PostgreSQL on the tables, in this connection; on Citus on the
    session's shards, on the worker the call is delegated to: none here)."""
    from contextledger.store.base import SearchQuery
    from contextledger.store.postgres.search import SEARCH_CALL, search_call, search_statement

    async with Ledger.open(pg_dsn) as ledger:
        session = await planted(ledger)
        head = session.head
        citus = ledger.store.citus  # type: ignore[attr-defined]
    carried = set(range(head - 8, head + 1))
    conn = await asyncpg.connect(asyncpg_dsn(pg_dsn))
    try:
        indexed = "SELECT max(seq) FROM contextledger.event_terms WHERE session_id = 'r'"
        assert await conn.fetchval(indexed) is None  # no search yet: nothing indexed
        for branch, hop in ((None, False), (None, True), (set(range(1, head + 1)), False)):
            q = SearchQuery("r", QUESTION, carried, head, branch, 5, "english", hop=hop)
            call = search_call(q, None)
            by_function = [await conn.fetch(SEARCH_CALL, *call) for _ in range(2)]
            text, args = search_statement(q, None, store=False)
            async with conn.transaction():
                by_statement = await conn.fetch(text, *args)
            for rows in (*by_function, by_statement):  # neighbours come in no set order
                rows.sort(key=lambda r: (-r["rank"], r["seq"]))
            assert [tuple(r) for r in by_function[0]] == [tuple(r) for r in by_statement]
            assert by_function[1] == by_function[0]
            assert any(r["rank"] > 0 and "18443" in r["message"] for r in by_statement)
            assert hop or all(r["rank"] >= 0 for r in by_statement)
        assert await conn.fetchval(indexed) == head  # the function's catch-up stored them
        prepared = {
            r[0]
            for r in await conn.fetch(
                "SELECT name FROM pg_prepared_statements WHERE name LIKE 'contextledger%'"
            )
        }
        here = {"contextledger_search_live", "contextledger_search_replay"}
        assert prepared == (here if citus is None else set())
    finally:
        await conn.close()
