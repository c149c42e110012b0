"""Appends that lex for recall (``statements.APPEND_MESSAGE``, ``WarmIndexes.appended``):
a session this process searches gets its new messages' postings and its latest human
turn's query lexemes from the appends themselves, so its next request makes no catch-up
statement. The postings must be the rows the catch-up would have computed, every request
must replay the same from a process that never saw the appends, and anything but a chain
of this store's own message appends (another writer, a cold-path event, the append
functions of PgBouncer and Citus) must fall back to the catch-up."""

from __future__ import annotations

import asyncio
import itertools
import json
from typing import Any

import asyncpg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contextledger import Ledger, Session
from contextledger.store.dsn import asyncpg_dsn
from contextledger.store.postgres import PostgresStore
from tests.integration.test_recall import FACT, QUESTION, chatter, planted, recall_blocks

BUDGET = 2000


def warm_of(ledger: Ledger) -> Any:
    store = ledger.store
    assert isinstance(store, PostgresStore)
    return store._warm


async def stored_postings(dsn: str, session_id: str, seqs: set[int]) -> dict[int, Any]:
    """The postings the server stored for ``seqs`` (``INDEX_BEHIND``, the catch-up's SQL):
    per seq, its length and its lexemes' counts."""
    conn = await asyncpg.connect(asyncpg_dsn(dsn))
    try:
        rows = await conn.fetch(
            "SELECT seq, lexeme, tf, dl FROM contextledger.event_terms"
            " WHERE session_id = $1 AND seq = ANY($2::bigint[])",
            session_id,
            sorted(seqs),
        )
    finally:
        await conn.close()
    found: dict[int, Any] = {}
    for seq, lexeme, tf, dl in rows:
        length, terms = found.setdefault(seq, [dl, {}])
        assert length == dl
        if lexeme:
            terms[lexeme] = tf
    return {seq: (dl, terms) for seq, (dl, terms) in found.items()}


def held_postings(ledger: Ledger, session_id: str, seqs: set[int]) -> dict[int, Any]:
    """The same, from the postings this process holds."""
    held = warm_of(ledger)._held[session_id].postings
    out: dict[int, Any] = {}
    for seq in seqs:
        terms = {}
        for lexeme in held.lexemes[seq]:
            at = list(held.seqs[lexeme]).index(seq)
            terms[lexeme] = held.tfs[lexeme][at]
        out[seq] = (held.dls[seq], terms)
    return out


async def replays_agree(dsn: str, session_id: str, requests: dict[int, Any]) -> None:
    """Every request, rebuilt by a process that never held the session."""
    async with Ledger.open(dsn) as other:
        session = await other.session(session_id)
        for seq, request in requests.items():
            assert await session.request_at(seq, token_budget=BUDGET) == request, seq


ODD_MESSAGES: list[dict[str, Any]] = [
    {"role": "user", "content": "Carla flew to Lisbon on 12 March 2024, gate B17, row 31."},
    {"role": "assistant", "content": ""},
    {"role": "user", "content": "again and again and again and again, the same words " * 6},
    {
        "role": "user",
        "content": [
            {"type": "text", "text": "what does the whiteboard photo say about quokkas?"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
        ],
    },
    {"role": "assistant", "content": "A long one: " + "orchard ledger relay 7311 " * 900},
    {"role": "user", "content": "¿Dónde está la estación? naïve café — 東京 and O'Brien's"},
    {"role": "assistant", "content": "It is 3.5 km north; call +1-555-0100 or mail a@b.io."},
]


async def test_a_request_after_its_own_appends_makes_no_catch_up_and_holds_the_same_postings(
    pg_dsn: str,
) -> None:
    async with Ledger.open(pg_dsn) as ledger:
        session = await planted(ledger)
        await session.get_messages_for_request(BUDGET)  # searched: held here from now on
        warm = warm_of(ledger)
        before = warm.caught_up
        requests: dict[int, Any] = {}
        first = session.head + 1
        for n, message in enumerate(ODD_MESSAGES * 2):
            await session.add_message(message)
            if message["role"] == "user":
                requests[session.head] = await session.get_messages_for_request(BUDGET)
            if n % 3 == 0:
                await session.add_message({"role": "assistant", "content": f"noted {n}"})
        requests[session.head] = await session.get_messages_for_request(BUDGET)  # (after a reply)
        # every request: each followed only this store's appends of messages
        asked = sum(1 for m in ODD_MESSAGES * 2 if m["role"] == "user")
        assert warm.caught_up - before == asked + 1
        seqs = set(range(first, session.head + 1))
        held = held_postings(ledger, "r", seqs)
        await ledger.store.wait_indexed()  # the catch-up's SQL stores the same messages
        assert held == await stored_postings(pg_dsn, "r", seqs)
        assert len(held) == len(seqs)  # (every one a message: none left out of the check)
    await replays_agree(pg_dsn, "r", requests)


async def test_another_writers_append_is_caught_up_and_found(pg_dsn: str) -> None:
    async with Ledger.open(pg_dsn) as here, Ledger.open(pg_dsn) as there:
        session = await planted(here)
        await session.get_messages_for_request(BUDGET)
        warm = warm_of(here)
        theirs = await there.session("r")
        await theirs.add_message({"role": "user", "content": "The quokka relay listens on 7399."})
        await chatter(theirs, 25, start=300)
        await session.refresh()
        # this handle appends on top of the other's events: its link has a gap before it
        await session.add_message({"role": "user", "content": "Which port has the quokka relay?"})
        before = warm.caught_up
        request = await session.get_messages_for_request(BUDGET)
        assert warm.caught_up == before  # caught up by the statement
        assert any("7399" in b for b in recall_blocks(request))
        # and linked again from there: the next turn needs no catch-up
        await session.add_message({"role": "assistant", "content": "On 7399."})
        await session.add_message({"role": "user", "content": QUESTION})
        request = await session.get_messages_for_request(BUDGET)
        assert warm.caught_up == before + 1
        assert any("18443" in b for b in recall_blocks(request))


async def test_what_its_appends_do_not_lex_is_caught_up(pg_dsn: str) -> None:
    """A checkpoint, a rollback: the request after each takes the catch-up (several
    messages in one append do not, nor does a tool call's query: the appends lexed them),
    and every request replays the same elsewhere."""
    async with Ledger.open(pg_dsn) as ledger:
        session = await planted(ledger)
        await session.get_messages_for_request(BUDGET)
        warm = warm_of(ledger)
        requests: dict[int, Any] = {}

        async def asked(*, caught_up: bool) -> None:
            before = warm.caught_up
            requests[session.head] = await session.get_messages_for_request(BUDGET)
            assert warm.caught_up == before + caught_up

        await session.add_messages(
            [
                {"role": "assistant", "content": "Two at once: the relay is on 7311."},
                {"role": "user", "content": "Where does the quokka relay listen?"},
            ]
        )
        await asked(caught_up=True)
        await session.add_message({"role": "assistant", "content": "On 7311."})
        await session.add_message({"role": "user", "content": "And the canary port?"})
        await asked(caught_up=True)
        mark = await session.checkpoint("before the tool")
        await asked(caught_up=False)  # the checkpoint is an event no append lexed
        await session.add_message(call(1, "canary port"))
        await asked(caught_up=True)  # the query reads the tool call too: lexed with it
        await session.add_message({"role": "tool", "tool_call_id": "c1", "content": "18443"})
        await session.rollback(mark)
        await session.add_message({"role": "user", "content": "So which port was it?"})
        await asked(caught_up=False)  # the rollback's event: a gap
        await session.add_message({"role": "assistant", "content": "18443."})
        await session.add_message({"role": "user", "content": FACT})
        await asked(caught_up=True)
    await replays_agree(pg_dsn, "r", requests)


async def test_appends_batched_across_sessions_lex_each_of_them(pg_dsn: str) -> None:
    async with Ledger.open(pg_dsn) as ledger:
        sessions: list[Session] = []
        for n in range(6):
            session = await ledger.session(f"b{n}", config={"token_counter": "chars"})
            await session.add_message({"role": "user", "content": f"{FACT} (copy {n})"})
            await chatter(session, 30, start=10 * n)
            await session.add_message({"role": "user", "content": QUESTION})
            await session.get_messages_for_request(BUDGET)
            sessions.append(session)
        store = ledger.store
        assert isinstance(store, PostgresStore)
        warm = warm_of(ledger)
        batches, before = store._batcher.batches, warm.caught_up
        requests: dict[str, dict[int, Any]] = {s.session_id: {} for s in sessions}
        for turn in range(4):
            await asyncio.gather(
                *(
                    s.add_message({"role": "assistant", "content": f"reply {turn} to {n}"})
                    for n, s in enumerate(sessions)
                )
            )
            await asyncio.gather(
                *(
                    s.add_message({"role": "user", "content": f"{QUESTION} ({turn}, {n})"})
                    for n, s in enumerate(sessions)
                )
            )
            for s in sessions:
                requests[s.session_id][s.head] = await s.get_messages_for_request(BUDGET)
        assert store._batcher.batches > batches  # (the batch statement ran)
        assert warm.caught_up - before == 4 * len(sessions)
        for s in sessions:
            seqs = set(range(s.head - 7, s.head + 1))
            held = held_postings(ledger, s.session_id, seqs)
            await store.wait_indexed()
            assert held == await stored_postings(pg_dsn, s.session_id, seqs)
    for session_id, asked in requests.items():
        await replays_agree(pg_dsn, session_id, asked)


async def test_the_append_functions_lex_nothing(pg_dsn: str) -> None:
    """Behind PgBouncer (and on Citus) appends call the server's functions, which return
    no postings: every request catches up, and finds what it did before."""
    async with Ledger.open(pg_dsn, pgbouncer=True) as ledger:
        session = await planted(ledger)
        await session.get_messages_for_request(BUDGET)
        warm = warm_of(ledger)
        for n in range(3):
            await session.add_message({"role": "assistant", "content": f"noted {n}"})
            await session.add_message({"role": "user", "content": QUESTION})
            request = await session.get_messages_for_request(BUDGET)
            assert any("18443" in b for b in recall_blocks(request))
        assert warm.caught_up == 0


WORDS = ["quokka", "relay", "port", "canary", "Lisbon", "7311", "orchard", "ledger", "gate"]
STEPS = st.lists(
    st.one_of(
        st.tuples(st.just("user"), st.lists(st.sampled_from(WORDS), min_size=1, max_size=5)),
        st.tuples(st.just("assistant"), st.lists(st.sampled_from(WORDS), max_size=5)),
        st.tuples(st.just("other"), st.lists(st.sampled_from(WORDS), min_size=1, max_size=3)),
        st.tuples(st.just("ask"), st.just([])),
    ),
    min_size=1,
    max_size=30,
)
_IDS = itertools.count()


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(steps=STEPS)
async def test_every_request_replays_the_same_whoever_lexed_its_postings(
    pg_dsn: str, steps: list[tuple[str, list[str]]]
) -> None:
    """Turns of this handle, appends of another process in between, requests at any
    point: each request (whether the appends or a catch-up brought its postings) is the
    one a process that never held the session rebuilds."""
    sid = f"h{next(_IDS)}"
    requests: dict[int, Any] = {}
    async with Ledger.open(pg_dsn) as here, Ledger.open(pg_dsn) as there:
        session = await here.session(sid, config={"token_counter": "chars"})
        await session.add_message({"role": "user", "content": FACT})
        await chatter(session, 12)
        theirs = await there.session(sid)
        for kind, words in steps:
            text = " ".join(words)
            if kind == "other":
                await theirs.add_message({"role": "user", "content": text})
                await session.refresh()
            elif kind == "ask":
                requests[session.head] = await session.get_messages_for_request(400)
            else:
                await session.add_message({"role": kind, "content": text})
        requests[session.head] = await session.get_messages_for_request(400)
    async with Ledger.open(pg_dsn) as other:
        again = await other.session(sid)
        for seq, request in requests.items():
            assert await again.request_at(seq, token_budget=400) == request


async def test_a_session_whose_requests_carry_everything_is_not_lexed(pg_dsn: str) -> None:
    """While a session's requests leave nothing out, its searches are skipped (the closed
    gate, ``search._ClosedGate``): its appends lex nothing (work no request would use),
    and the first request that leaves something out catches up as before."""
    async with Ledger.open(pg_dsn) as ledger:
        session = await ledger.session("short", config={"token_counter": "chars"})
        warm = warm_of(ledger)
        for n in range(6):
            await session.add_message({"role": "user", "content": f"{QUESTION} {n}"})
            await session.add_message({"role": "assistant", "content": f"reply {n}"})
            request = await session.get_messages_for_request(100_000)
            assert not recall_blocks(request)
        assert "short" in warm._held  # (searched once: held, then its gate was closed)
        assert warm._held["short"].links is None  # its appends since lexed nothing
        assert warm.caught_up == 0
        await session.add_message({"role": "user", "content": FACT})
        await chatter(session, 40)
        await session.add_message({"role": "user", "content": QUESTION})
        request = await session.get_messages_for_request(BUDGET)  # leaves most out
        assert any("18443" in b for b in recall_blocks(request))
        assert warm._held["short"].links == []  # caught up: its appends lex again
        await session.add_message({"role": "assistant", "content": "On 18443."})
        await session.add_message({"role": "user", "content": QUESTION + " (again)"})
        request = await session.get_messages_for_request(BUDGET)
        assert warm.caught_up == 1
        assert any("18443" in b for b in recall_blocks(request))


async def fill(session: Session, fact: str, turns: int, word: str) -> None:
    await session.add_message({"role": "user", "content": fact})
    for i in range(turns):
        await session.add_message(
            {"role": "user", "content": f"{word} step {i}: please tidy the caching module " * 4}
        )
        await session.add_message(
            {"role": "assistant", "content": f"done with {word} {i}, vacuum looks fine " * 4}
        )


async def test_a_chain_made_again_under_the_id_elsewhere_is_caught_up(pg_dsn: str) -> None:
    """Another process purges the session and writes it again, shorter, its latest turn
    the same text as the last one this process lexed: a handle that reads the session
    (opened again, or refreshed) must not take the old chain's postings."""
    for reopen in (True, False):
        async with Ledger.open(pg_dsn) as here:
            session = await here.session("again", config={"token_counter": "chars"})
            await fill(session, "OLD: the orchard gateway binds to 18443.", 40, "tidy")
            await session.get_messages_for_request(BUDGET)  # held here
            await session.add_message({"role": "assistant", "content": "ok"})
            await session.add_message({"role": "user", "content": QUESTION})  # lexed
            await session.get_messages_for_request(BUDGET)
            async with Ledger.open(pg_dsn) as there:
                await there.store.purge("again", "test")
                theirs = await there.session("again", config={"token_counter": "chars"})
                for n in range(5):  # (the new fact at another seq than the old one)
                    await theirs.add_message({"role": "user", "content": f"hello {n}"})
                await fill(theirs, "NEW: the orchard gateway binds to 29999.", 25, "lint")
                await theirs.add_message({"role": "user", "content": QUESTION})
            if reopen:
                session = await here.session("again")
            else:
                await session.refresh()
            request = await session.get_messages_for_request(BUDGET)
            seq = session.request_seq
            blocks = recall_blocks(request)
            assert any("29999" in b for b in blocks) and "18443" not in str(request)
            assert await session.request_at(seq, token_budget=BUDGET) == request
        await replays_agree(pg_dsn, "again", {seq: request})
        async with Ledger.open(pg_dsn) as ledger:
            await ledger.store.purge("again", "test")


async def test_what_the_appends_lexed_counts_in_the_process_budget(pg_dsn: str) -> None:
    """Postings appends keep for the next request are held memory like the rest: they
    count in the process's budget (another session is dropped to make room) and leave
    it when taken or dropped."""
    from contextledger.store.postgres.warm import _PROCESS

    async with Ledger.open(pg_dsn) as ledger:
        store = ledger.store
        assert isinstance(store, PostgresStore)
        warm = warm_of(ledger)
        other = await planted(ledger)
        await other.get_messages_for_request(BUDGET)
        session = await ledger.session("big", config={"token_counter": "chars"})
        await fill(session, FACT, 40, "tidy")
        await session.add_message({"role": "user", "content": QUESTION})
        await session.get_messages_for_request(BUDGET)
        held = warm._held["big"]
        before = _PROCESS.total
        words = " ".join(f"w{n}x" for n in range(400))  # 400 distinct lexemes a message
        for n in range(5):
            await session.add_message({"role": "assistant", "content": f"{words} {n}"})
        linked = held.held - held.postings.size  # what the links carry
        assert linked >= 5 * 400 and held.links is not None and len(held.links) == 5
        assert _PROCESS.total - before == linked  # counted as the appends kept them
        warm._budget = _PROCESS.total - 1  # one posting less: the other session goes
        await session.add_message({"role": "user", "content": QUESTION + " again"})
        assert "r" not in warm._held and "big" in warm._held
        size = held.postings.size
        await session.get_messages_for_request(BUDGET)  # taken into the postings
        assert held.links == [] and held.postings.size > size
        assert held.size == held.postings.size


async def test_a_busy_session_keeps_its_noted_tip_among_many(
    pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store notes a bounded number of chain tips (``MAX_HEADS``): the least recently
    noted go first, so a session in a conversation keeps its own while others come and
    go (dropped, its next append reads the head and its request catches up)."""
    from contextledger.store.postgres import tips

    monkeypatch.setattr(tips, "MAX_HEADS", 4)
    async with Ledger.open(pg_dsn) as ledger:
        session = await planted(ledger)
        await session.get_messages_for_request(BUDGET)
        warm = warm_of(ledger)
        before = warm.caught_up
        for n in range(10):
            other = await ledger.session(f"passing{n}")  # another session noted
            await other.add_message({"role": "user", "content": "hi"})
            await session.add_message({"role": "assistant", "content": f"noted {n}"})
            await session.add_message({"role": "user", "content": f"{QUESTION} ({n})"})
            await session.get_messages_for_request(BUDGET)
        assert warm.caught_up - before == 10


def call(n: int, query: str) -> dict[str, Any]:
    arguments = json.dumps({"q": query})
    function = {"name": "lookup", "arguments": arguments}
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": f"c{n}", "type": "function", "function": function}],
    }


async def test_a_tool_loop_s_requests_need_no_catch_up(pg_dsn: str) -> None:
    """In an agent's tool loop the query is the turn's text and the calls after it: each
    call's append lexes that whole text, so the request after a call (and its speculative
    search, started at the call) and after its result makes no catch-up either; a call
    appended after another writer's event falls back, and every request replays."""
    async with Ledger.open(pg_dsn) as ledger, Ledger.open(pg_dsn) as other:
        session = await planted(ledger)
        await session.get_messages_for_request(BUDGET)
        warm = warm_of(ledger)
        requests: dict[int, Any] = {}
        before, n = warm.caught_up, 0
        for turn in range(3):
            await session.add_message({"role": "user", "content": f"{QUESTION} ({turn})"})
            for step in range(2):  # two calls, each answered, a request after each
                n += 1
                await session.add_message(call(n, f"orchard gateway port {turn}.{step}"))
                requests[session.head] = await session.get_messages_for_request(BUDGET)
                await session.add_message(
                    {"role": "tool", "tool_call_id": f"c{n}", "content": f"port {n}"}
                )
                requests[session.head] = await session.get_messages_for_request(BUDGET)
            await session.add_message({"role": "assistant", "content": f"It is 18443 ({turn})."})
        assert warm.caught_up - before == 12
        assert session._requests.speculation_hits > 0  # (the searches started at the calls)
        theirs = await other.session("r")
        await session.add_message({"role": "user", "content": QUESTION})
        await theirs.add_message({"role": "assistant", "content": "(another writer)"})
        await session.refresh()
        n += 1
        await session.add_message(call(n, "orchard gateway port"))
        before = warm.caught_up
        requests[session.head] = await session.get_messages_for_request(BUDGET)
        assert warm.caught_up == before  # a gap before the call: caught up
        assert any("18443" in b for b in recall_blocks(requests[session.head]))
    await replays_agree(pg_dsn, "r", requests)


async def test_messages_appended_together_are_lexed_each(pg_dsn: str) -> None:
    """``add_messages`` (the frameworks' adapters append a run's items so) lexes every
    message of the run in its one statement, the query as it stands after each (a human
    turn, then a tool call): the request after it makes no catch-up, the postings are the
    catch-up's, and every request replays."""
    async with Ledger.open(pg_dsn) as ledger:
        session = await planted(ledger)
        await session.get_messages_for_request(BUDGET)
        warm = warm_of(ledger)
        requests: dict[int, Any] = {}
        first, before = session.head + 1, warm.caught_up
        pairs = list(zip(ODD_MESSAGES[::2], ODD_MESSAGES[1::2], strict=False))
        for n, (one, two) in enumerate(pairs):
            await session.add_messages([one, two])
            if two["role"] == "user" or one["role"] == "user":
                requests[session.head] = await session.get_messages_for_request(BUDGET)
            await session.add_messages(
                [
                    {"role": "user", "content": f"look up the canary port ({n})"},
                    call(100 + n, f"canary port {n}"),
                    {"role": "tool", "tool_call_id": f"c{100 + n}", "content": "18443"},
                ]
            )
            requests[session.head] = await session.get_messages_for_request(BUDGET)
        assert warm.caught_up - before == len(requests)
        seqs = set(range(first, session.head + 1))
        held = held_postings(ledger, "r", seqs)
        await ledger.store.wait_indexed()
        assert held == await stored_postings(pg_dsn, "r", seqs)
    await replays_agree(pg_dsn, "r", requests)


async def test_a_run_past_the_links_room_is_not_lexed(pg_dsn: str) -> None:
    """The hold keeps at most ``MAX_LINKS`` appended messages for the next request: a run
    that would not fit (a bulk import through ``add_messages``) lexes nothing (its work
    would be dropped), and the request after it catches up and finds what it holds."""
    from contextledger.store.postgres.warm import MAX_LINKS

    async with Ledger.open(pg_dsn) as ledger:
        session = await planted(ledger)
        await session.get_messages_for_request(BUDGET)
        warm = warm_of(ledger)
        assert warm.lexes("r", MAX_LINKS) and not warm.lexes("r", MAX_LINKS + 1)
        await session.add_messages([{"role": "assistant", "content": "one"}] * 3)
        assert warm.lexes("r", MAX_LINKS - 3) and not warm.lexes("r", MAX_LINKS - 2)
        await session.add_messages(
            [
                {"role": "user", "content": f"bulk {n}: the relay port is {7000 + n}"}
                for n in range(MAX_LINKS)
            ]
        )
        assert warm._held["r"].links is None  # a gap: nothing kept
        await session.add_message({"role": "user", "content": "which relay port had bulk 17?"})
        before = warm.caught_up
        request = await session.get_messages_for_request(BUDGET)
        assert warm.caught_up == before
        assert any("7017" in b for b in recall_blocks(request))
