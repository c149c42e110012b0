"""Recall's warm path on PostgreSQL (``store/postgres/warm.py``): the postings a process
holds agree with the ledger whoever appended, and with a process that loads them cold."""

from __future__ import annotations

import asyncio
import sys
import threading
from datetime import UTC, datetime
from typing import Any

import asyncpg
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from structlog.testing import capture_logs

from contextledger import Ledger
from contextledger.core.events import MessageAppended, SessionCreated
from contextledger.store.dsn import asyncpg_dsn
from contextledger.store.lexical import DEEP_LIMIT, PER_TERM
from contextledger.store.postgres import PostgresStore
from contextledger.store.postgres.placeholders import bind
from contextledger.store.postgres.search import FORWARD, INDEX_BATCH, INDEX_BEHIND, sync_sql
from contextledger.store.postgres.warm import WarmIndexes, ranked
from contextledger.store.postings import Missing
from tests.examples import examples
from tests.integration.service_support import until
from tests.integration.test_recall import (
    FACT,
    QUESTION,
    chatter,
    message_seqs,
    planted,
    recall_blocks,
    stored,
)

ARGS: dict[str, Any] = {"limit": 10, "text_config": "english", "branch": None}


async def cold_search(dsn: str, session_id: str, query: str, upto: int, **args: Any) -> Any:
    """The same search from a store that holds nothing yet (another process)."""
    async with Ledger.open(dsn) as other:
        return await other.store.search_messages(
            session_id, query, exclude=set(), upto_seq=upto, **{**ARGS, **args}
        )


def pg_store(ledger: Ledger) -> PostgresStore:
    store = ledger.store
    assert isinstance(store, PostgresStore)
    return store


async def test_another_writers_messages_are_found_and_the_answer_is_a_cold_process_s(
    pg_dsn: str,
) -> None:
    async with Ledger.open(pg_dsn) as here, Ledger.open(pg_dsn) as there:
        session = await planted(here)
        assert any(
            "18443" in b for b in recall_blocks(await session.get_messages_for_request(2000))
        )
        assert "r" in pg_store(here)._warm._held  # held here since that search
        # another process appends a fact, and chatter that pushes it out of the view
        theirs = await there.session("r")
        await theirs.add_message({"role": "user", "content": "The orchard-api canary is 18550."})
        await chatter(theirs, 30, start=100)
        await theirs.add_message({"role": "user", "content": "Which port has the canary?"})
        await session.refresh()
        request = await session.get_messages_for_request(2000)
        assert any("18550" in b for b in recall_blocks(request))
        head = (await here.store.session_info("r")).head
        for query in ("canary port orchard-api", QUESTION):
            warm = await here.store.search_messages(
                "r", query, exclude=set(), upto_seq=head, **ARGS
            )
            assert warm == await cold_search(pg_dsn, "r", query, head)
            assert warm[0]


async def test_a_session_purged_and_written_again_is_searched_afresh(pg_dsn: str) -> None:
    async with Ledger.open(pg_dsn) as ledger:
        await planted(ledger)
        head = (await ledger.store.session_info("r")).head
        found, _ = await ledger.store.search_messages(
            "r", QUESTION, exclude=set(), upto_seq=head, **ARGS
        )
        assert found
        await ledger.store.purge("r", "test")
        again = await ledger.session("r", config={"token_counter": "chars"})
        await again.add_message({"role": "user", "content": "the orchard-api moved to 19001"})
        await chatter(again, 5)
        head = (await ledger.store.session_info("r")).head
        warm = await ledger.store.search_messages(
            "r", QUESTION, exclude=set(), upto_seq=head, **ARGS
        )
        assert warm == await cold_search(pg_dsn, "r", QUESTION, head)
        assert [m.message["content"] for m in warm[1] if "orchard" in m.message["content"]] == [
            "the orchard-api moved to 19001"
        ]


async def test_a_chain_written_again_from_the_same_first_event_is_searched_afresh(
    pg_dsn: str,
) -> None:
    """Purged by another process, then written again from the same ``session.created``
    (an import does so): the first event's hash is the old one, the chain after it not."""
    at = datetime(2026, 1, 2, tzinfo=UTC)

    async def write(ledger: Ledger, texts: list[str]) -> int:
        await ledger.store.create_session("same", SessionCreated(None, {}, {}), created_at=at)
        for text in texts:
            payload = MessageAppended({"role": "user", "content": text}, 1, False, "chars")
            await ledger.store.append("same", [payload], created_at=at)
        return len(texts) + 1

    async with Ledger.open(pg_dsn) as ledger, Ledger.open(pg_dsn) as other:
        head = await write(ledger, ["the orchard-api port is 18443", "nothing else"] * 3)
        found = await ledger.store.search(
            "same", "orchard port", exclude=set(), upto_seq=head, **ARGS
        )
        assert found
        await other.store.purge("same", "test")
        head = await write(other, ["the vacuum schedule is weekly"] * 8)  # longer: same seqs
        warm = await ledger.store.search_messages(
            "same", "orchard port vacuum", exclude=set(), upto_seq=head, **ARGS
        )
        assert warm == await cold_search(pg_dsn, "same", "orchard port vacuum", head)
        assert {m.message["content"] for m in warm[1]} == {"the vacuum schedule is weekly"}


async def test_the_warm_indexes_keep_to_their_budget(pg_dsn: str) -> None:
    async with Ledger.open(pg_dsn) as ledger:
        store = pg_store(ledger)
        for sid in ("a", "b"):
            session = await ledger.session(sid, config={"token_counter": "chars"})
            await session.add_message({"role": "user", "content": f"{sid}: {FACT}"})
            await chatter(session, 10)
        store._warm = WarmIndexes(budget=1)  # room for the session being searched only
        heads = {sid: (await store.session_info(sid)).head for sid in ("a", "b")}
        first = {}
        for sid in ("a", "b", "a"):
            found = await store.search_messages(
                sid, QUESTION, exclude=set(), upto_seq=heads[sid], **ARGS
            )
            assert list(store._warm._held) == [sid]
            assert first.setdefault(sid, found) == found
            assert found[0]


async def test_the_budget_is_the_process_s_across_stores(pg_dsn: str) -> None:
    """A service opens a store per tenant: their warm indexes share one budget."""
    async with Ledger.open(pg_dsn) as one, Ledger.open(pg_dsn) as two:
        for ledger, sid in ((one, "a"), (two, "b")):
            session = await ledger.session(sid, config={"token_counter": "chars"})
            await session.add_message({"role": "user", "content": f"{sid}: {FACT}"})
            await chatter(session, 10)
            pg_store(ledger)._warm = WarmIndexes(budget=1)
        heads = {sid: (await one.store.session_info(sid)).head for sid in ("a", "b")}
        first = await one.store.search("a", QUESTION, exclude=set(), upto_seq=heads["a"], **ARGS)
        assert list(pg_store(one)._warm._held) == ["a"]
        await two.store.search("b", QUESTION, exclude=set(), upto_seq=heads["b"], **ARGS)
        assert list(pg_store(two)._warm._held) == ["b"]
        assert list(pg_store(one)._warm._held) == []  # the other store's, dropped
        again = await one.store.search("a", QUESTION, exclude=set(), upto_seq=heads["a"], **ARGS)
        assert again == first and first


async def test_a_rollback_by_another_process_leaves_its_messages_out(pg_dsn: str) -> None:
    """Messages rolled back take no place among the matches (the branch is known here)."""
    args = {**ARGS, "limit": 2}
    async with Ledger.open(pg_dsn) as here, Ledger.open(pg_dsn) as there:
        session = await here.session("rb", config={"token_counter": "chars"})
        await session.add_message({"role": "user", "content": FACT})
        await chatter(session, 3)
        point = (await here.store.session_info("rb")).head
        for _ in range(3):  # better matches than the fact, soon off the branch
            await session.add_message({"role": "user", "content": f"{QUESTION} {FACT}"})
        await chatter(session, 3, start=10)
        head = (await here.store.session_info("rb")).head
        found, _ = await here.store.search_messages(
            "rb", QUESTION, exclude=set(), upto_seq=head, **args
        )
        assert [seq for seq, _ in found] == [point + 3, point + 2]
        await (await there.session("rb")).rollback(point)
        head = (await here.store.session_info("rb")).head
        found, read = await here.store.search_messages(
            "rb", QUESTION, exclude=set(), upto_seq=head, **args
        )
        assert found[0][0] == 2  # the fact, on the branch
        assert not {point + 1, point + 2, point + 3} & {m.seq for m in read}
        assert (found, read) == await cold_search(pg_dsn, "rb", QUESTION, head, limit=2)


WORDS = ["orchard", "gateway", "port", "staging", "canary", "deploy", "vacuum", "cache", "18443"]


@settings(
    max_examples=examples(8),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    texts=st.lists(
        st.lists(st.sampled_from(WORDS), min_size=0, max_size=6).map(" ".join),
        min_size=1,
        max_size=25,
    ),
    searches=st.lists(st.integers(min_value=1, max_value=25), max_size=4),
    query=st.lists(st.sampled_from(WORDS), min_size=1, max_size=3).map(" ".join),
)
async def test_searched_along_the_way_or_cold_the_answer_is_the_same(
    pg_dsn: str, texts: list[str], searches: list[int], query: str
) -> None:
    """Postings caught up search by search (with searches at earlier seqs, as replays
    make) rank as those loaded at once; and as ``memory://``'s, which shares the code."""
    sid = f"p{abs(hash((tuple(texts), tuple(searches), query)))}"
    async with Ledger.open(pg_dsn) as ledger, Ledger.open("memory://") as memory:
        for led in (ledger, memory):
            await led.session(sid, config={"token_counter": "chars"})
        for n, text in enumerate(texts, start=1):
            for led in (ledger, memory):
                payload = MessageAppended({"role": "user", "content": text}, 1, False, "chars")
                await led.store.append(sid, [payload], created_at=datetime.now(UTC))
            if n in searches:
                await ledger.store.search(sid, query, exclude=set(), upto_seq=n + 1, **ARGS)
        head = len(texts) + 1
        for upto in sorted({head, *(s + 1 for s in searches if s < len(texts))}):
            warm = await ledger.store.search_messages(
                sid, query, exclude=set(), upto_seq=upto, **ARGS
            )
            assert warm == await cold_search(pg_dsn, sid, query, upto)
            mem = await memory.store.search(sid, query, exclude=set(), upto_seq=upto, **ARGS)
            assert [s for s, _ in warm[0]] == [s for s, _ in mem]


async def test_postings_are_stored_after_the_request_a_batch_at_a_time(pg_dsn: str) -> None:
    # The request's catch-up only reads; the postings it found unstored are stored by a
    # task after it once the head is INDEX_BATCH seqs past them, or when asked to
    # (``wait_indexed``), and a process that loads the session meanwhile computes the rest.
    async with Ledger.open(pg_dsn) as ledger:
        store = pg_store(ledger)
        session = await planted(ledger)  # 84 messages: past a batch at the first search
        await session.get_messages_for_request(2000)
        await store.wait_indexed(store=False)  # the task started after the request
        assert await stored(pg_dsn, "r") == await message_seqs(session)
        await session.add_message({"role": "user", "content": "the quokka relay runs on 7311"})
        await session.add_message({"role": "assistant", "content": "Noted, relay 7311."})
        await session.get_messages_for_request(2000)
        await store.wait_indexed(store=False)
        new = (await message_seqs(session))[-2:]
        assert not set(new) & set(await stored(pg_dsn, "r"))  # within a batch: noted
        head = session.head
        warm = await store.search_messages(
            "r", "quokka relay", exclude=set(), upto_seq=head, **ARGS
        )
        assert sorted(s for s, _ in warm[0]) == new  # found, from the held postings
        assert warm == await cold_search(pg_dsn, "r", "quokka relay", head)  # computed there
        await store.wait_indexed()  # asked: stored
        assert await stored(pg_dsn, "r") == await message_seqs(session)
        await chatter(session, INDEX_BATCH // 2)  # a batch's worth of seqs
        await session.get_messages_for_request(2000)
        await store.wait_indexed(store=False)
        assert await stored(pg_dsn, "r") == await message_seqs(session)
        assert not store._unstored and not store._indexing


async def test_postings_another_process_stores_at_the_same_time_are_stored_after(
    pg_dsn: str,
) -> None:
    # The store statement is a plain INSERT (no ON CONFLICT: the stored postings are a
    # prefix). Another process stores the same session's first (its transaction holds the
    # rows while this one's statement runs and waits on them): this one collides, runs
    # again from after them, and stores what they lack; nothing fails, nothing is lost.
    assert "ON CONFLICT" not in INDEX_BEHIND
    async with Ledger.open(pg_dsn) as ledger:
        store = pg_store(ledger)
        session = await planted(ledger)
        await session.get_messages_for_request(2000)
        await store.wait_indexed(store=False)
        await chatter(session, 3, start=50)
        await session.get_messages_for_request(2000)
        assert "r" in store._unstored  # noted, within a batch
        other = await asyncpg.connect(asyncpg_dsn(pg_dsn))
        try:
            statement, args = bind(INDEX_BEHIND, {}, "r")
            async with other.transaction():
                (theirs,) = await other.fetch(statement, *args)
                assert theirs[0] > 0  # the other process's rows, not committed yet
                await chatter(session, 2, start=60)  # past what it stores
                with capture_logs() as logs:
                    mine = asyncio.ensure_future(store.wait_indexed())

                    async def waiting() -> bool:
                        return bool(await other.fetchval(WAITING_ON_A_ROW))

                    await until(waiting, "the store's statement waits on those rows")
                    assert not mine.done()
            await asyncio.wait_for(mine, 30)  # the other transaction committed
        finally:
            await other.close()
        assert not [e for e in logs if e["event"] == "recall_index_failed"]
        seqs = await message_seqs(session)
        assert theirs[1] < seqs[-1] and await stored(pg_dsn, "r") == seqs


#: Whether another backend waits for this one's transaction (its rows).
WAITING_ON_A_ROW = (
    "SELECT EXISTS (SELECT FROM pg_stat_activity"
    " WHERE pg_backend_pid() = ANY(pg_blocking_pids(pid)))"
)


async def test_closing_the_store_stores_the_postings_a_batch_was_waiting_for(
    pg_dsn: str,
) -> None:
    async with Ledger.open(pg_dsn) as ledger:
        session = await planted(ledger)
        await session.get_messages_for_request(2000)
        await ledger.store.wait_indexed(store=False)  # (its task would store what follows)
        await session.add_message({"role": "user", "content": "the quokka relay runs on 7311"})
        await session.get_messages_for_request(2000)
        assert "r" in pg_store(ledger)._unstored
        seqs = await message_seqs(session)
    assert await stored(pg_dsn, "r") == seqs


async def test_a_purge_leaves_no_postings_a_batch_or_a_task_would_have_stored(
    pg_dsn: str,
) -> None:
    async with Ledger.open(pg_dsn) as ledger:
        store = pg_store(ledger)
        session = await planted(ledger)
        await session.get_messages_for_request(2000)  # a task storing 84 messages' postings
        await store.purge("r", "test")  # waits for it, then removes them
        assert await stored(pg_dsn, "r") == []
        again = await ledger.session("r2", config={"token_counter": "chars"})
        await again.add_message({"role": "user", "content": "the quokka relay runs on 7311"})
        await chatter(again, 3)
        await store.search_messages("r2", "quokka", exclude=set(), upto_seq=again.head, **ARGS)
        assert "r2" in store._unstored
        await store.purge("r2", "test")
        assert "r2" not in store._unstored and "r2" not in store._indexing
    assert await stored(pg_dsn, "r2") == []


async def test_a_cold_process_reads_what_its_searches_read_then_the_rest(pg_dsn: str) -> None:
    # A process that did not write the session holds what it caught up with; its first
    # search loads a lexeme's older postings newest first as far as it reads them (a
    # second hop computes the lexemes of the messages it starts from), and the rest are
    # read after the request. The answers are those of the process that holds them all:
    # live, anchored far back, with a second hop or not, before the rest and after.
    words = ["gateway", "answered", "attempt", "code", "orchard", "ledger", "quokka"]
    async with Ledger.open(pg_dsn) as here:
        session = await here.session("long", config={"token_counter": "chars"})
        await session.add_message({"role": "user", "content": FACT})
        await session.add_messages(
            [
                {
                    "role": "user",
                    "content": f"the {words[i % 7]} answered attempt {i} code {i % 97}",
                }
                for i in range(6 * DEEP_LIMIT)
            ]
        )
        await session.add_message({"role": "user", "content": QUESTION})
        await session.get_messages_for_request(2000)  # held whole here (nothing stored yet)
        await here.store.wait_indexed()
        head = session.head
        whole = pg_store(here)._warm._held["long"].postings
        assert whole.base <= 1  # (nothing was stored: held whole from seq 1)
        searches = [
            (query, upto, hop)
            for query, upto in (
                ("gateway attempt code", head),
                (QUESTION, head),
                ("quokka answered attempt", head // 3),  # back past what was read
                ("orchard code 41", 40),
            )
            for hop in (False, True)
        ]
        for query, upto, hop in searches:
            args = {**ARGS, "limit": 20, "hop": hop}
            warm = await here.store.search_messages(
                "long", query, exclude=set(), upto_seq=upto, **args
            )
            assert warm[0], (query, upto, hop)
            async with Ledger.open(pg_dsn) as there:  # a first search, each
                cold = await there.store.search_messages(
                    "long", query, exclude=set(), upto_seq=upto, **args
                )
                held = pg_store(there)._warm._held["long"].postings  # before the rest
                assert held.base == head + 1 and 0 < held.count < whole.count
                if upto == head:  # (one anchored far back reads all after its anchor)
                    assert held.count < whole.count // 4
                assert cold == warm, (query, upto, hop)
                await there.store.wait_indexed()  # the rest, read after the search
                assert held.base == 0 and held.count == whole.count
                assert {k: set(v) for k, v in held.lexemes.items()} == {
                    k: set(v) for k, v in whole.lexemes.items()
                }
                again = await there.store.search_messages(
                    "long", query, exclude=set(), upto_seq=upto, **args
                )
                assert again == warm
        # a process whose budget the rest would not fit reads only what its searches read
        async with Ledger.open(pg_dsn) as small:
            pg_store(small)._warm = WarmIndexes(budget=whole.count // 2)
            for query, upto, hop in searches[:4]:
                args = {**ARGS, "limit": 20, "hop": hop}
                warm = await here.store.search_messages(
                    "long", query, exclude=set(), upto_seq=upto, **args
                )
                found = await small.store.search_messages(
                    "long", query, exclude=set(), upto_seq=upto, **args
                )
                await small.store.wait_indexed()
                assert found == warm
                held = pg_store(small)._warm._held["long"].postings
                assert held.base == head + 1 and held.count < whole.count // 2


async def test_searches_whose_postings_are_dropped_meanwhile_still_answer(pg_dsn: str) -> None:
    # Two sessions searched at once by a process with room for one: each one's catch-up
    # drops the other's hold while that search still needs older postings; the search goes
    # on with the postings it has (loaded into them), and answers as the writer does.
    words = ["gateway", "answered", "attempt", "code", "orchard", "ledger", "quokka"]
    async with Ledger.open(pg_dsn) as here:
        heads = {}
        for sid in ("la", "lb"):
            session = await here.session(sid, config={"token_counter": "chars"})
            await session.add_messages(
                [
                    {"role": "user", "content": f"{sid} {words[i % 7]} attempt {i} code {i % 31}"}
                    for i in range(3 * PER_TERM * 7)
                ]
            )
            await session.get_messages_for_request(2000)
            heads[sid] = session.head
        await here.store.wait_indexed()
        args = {**ARGS, "limit": 20, "hop": True}

        async def search(store: Any, sid: str) -> Any:
            return await store.search_messages(
                sid, "quokka attempt code 17", exclude=set(), upto_seq=heads[sid], **args
            )

        async with Ledger.open(pg_dsn) as there:
            pg_store(there)._warm = WarmIndexes(budget=1)
            found = await asyncio.wait_for(
                asyncio.gather(search(there.store, "la"), search(there.store, "lb")), 60
            )
            assert list(found) == [await search(here.store, "la"), await search(here.store, "lb")]
            assert all(f[0] for f in found)


async def _long_session(ledger: Ledger, sid: str) -> int:
    """A session whose stored postings a process that did not write it holds in part."""
    words = ["gateway", "answered", "attempt", "code", "orchard", "ledger", "quokka"]
    session = await ledger.session(sid, config={"token_counter": "chars"})
    await session.add_message({"role": "user", "content": FACT})
    await session.add_messages(
        [
            {"role": "user", "content": f"the {words[i % 7]} answered attempt {i} code {i % 97}"}
            for i in range(4 * DEEP_LIMIT)
        ]
    )
    await session.add_message({"role": "user", "content": QUESTION})
    await session.get_messages_for_request(2000)
    await ledger.store.wait_indexed()
    return session.head


async def test_what_was_loaded_meanwhile_is_not_asked_for_again(pg_dsn: str) -> None:
    # A search in a process that holds the session's postings in part finds older ones
    # missing; by the time it has the lock, another search of the session or the read of
    # the rest (``complete``) loaded them: it reads nothing and ranks again (it once failed
    # the request: "nothing to load"). Two requests of one session at once did that.
    async with Ledger.open(pg_dsn) as here:
        head = await _long_session(here, "long")
        args = {**ARGS, "limit": 20, "hop": True}
        want = await here.store.search_messages(
            "long", QUESTION, exclude=set(), upto_seq=head, **args
        )
    async with Ledger.open(pg_dsn) as there:
        store = pg_store(there)
        fetch = store._fetch("long", live=True)
        synced = await store._warm.sync("long", QUESTION, "english", fetch, sync_sql())
        assert synced is not None and synced.postings.base > 1
        try:
            ranked(synced, upto_seq=head, exclude=set(), branch=None, limit=20, hop=True)
        except Missing as caught:
            missing = caught
        else:
            raise AssertionError("a cold process holds the older postings in part")
        store._warm.complete_later("long", fetch)  # the rest, read meanwhile
        await store._warm.wait()
        assert synced.postings.base == 0
        loaded = synced.postings.count
        await store._warm.fill(synced, missing, fetch, FORWARD)
        assert synced.postings.count == loaded  # nothing read again
        found, _ = ranked(synced, upto_seq=head, exclude=set(), branch=None, limit=20, hop=True)
        assert found == want[0]  # the writer's answer
    assert not store._warm._held  # a closed store's postings make room for the others'
    for _ in range(3):  # and through the public path, in fresh processes
        async with Ledger.open(pg_dsn) as cold:
            a, b = await cold.session("long"), await cold.session("long")
            requests = await asyncio.gather(
                a.get_messages_for_request(2000), b.get_messages_for_request(2000)
            )
            assert requests[0] == requests[1]
            assert any("18443" in block for block in recall_blocks(requests[0]))


def test_stores_on_several_threads_share_the_budget_safely(pg_dsn: str) -> None:
    # Ledgers on two threads' event loops (an adapter's loop thread beside the caller's):
    # each store's searches evict the other's holds, to one process-wide budget, while
    # the other thread adds and reorders its own. Nothing fails (it once did: "OrderedDict
    # mutated during iteration"), and the count of what is held stays exact.
    from contextledger.store.postgres.warm import _PROCESS

    sessions = 100
    failures: list[BaseException] = []
    totals: list[tuple[int, int]] = []
    stores: list[WarmIndexes] = []
    ready = threading.Barrier(3)  # the two threads and this one
    setting_up = threading.Lock()
    done = threading.Barrier(2)

    async def run(tag: str) -> None:
        # one thread at a time until both have searched once: the first calls import and
        # compile, which CPython 3.11 does not do safely in two threads at once
        assert setting_up.acquire(timeout=60)
        async with Ledger.open(pg_dsn) as ledger:
            heads = {}
            for i in range(sessions):
                session = await ledger.session(f"{tag}{i}", config={"token_counter": "chars"})
                await session.add_messages(
                    [{"role": "user", "content": f"{FACT} {tag} {i} {n}"} for n in range(4)]
                )
                heads[session.session_id] = session.head

            async def search(sid: str) -> None:
                found = await ledger.store.search_messages(
                    sid, QUESTION, exclude=set(), upto_seq=heads[sid], **ARGS
                )
                assert found[0]

            await search(f"{tag}0")  # (whatever a first search imports, imported)
            setting_up.release()
            warm = pg_store(ledger)._warm = WarmIndexes(budget=3000)  # ~60 sessions
            stores.append(warm)
            ready.wait()
            ready.wait()
            for n in range(3 * sessions):
                await search(f"{tag}{n % sessions}")
            done.wait()  # both idle: the count and the holds are still
            held = sum(w.size for s in stores for w in s._held.values())
            totals.append((_PROCESS.total, held))
            done.wait()

    def thread(tag: str) -> None:
        try:
            asyncio.run(run(tag))
        except BaseException as exc:  # reported by the test's thread
            failures.append(exc)
            ready.abort()
            done.abort()

    threads = [threading.Thread(target=thread, args=(tag,), daemon=True) for tag in "xy"]
    for t in threads:
        t.start()
    interval = sys.getswitchinterval()
    try:
        ready.wait()
        sys.setswitchinterval(1e-6)  # the threads' Python interleaves as finely as it can
        ready.wait()
    except threading.BrokenBarrierError:
        pass  # a thread failed: said below
    finally:
        for t in threads:
            t.join(120)
        sys.setswitchinterval(interval)
    assert not failures, failures
    assert len(totals) == 2 and all(total == held for total, held in totals)
