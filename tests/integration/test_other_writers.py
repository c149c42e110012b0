"""A handle's requests after other writers changed the session under it: its settings
and model, or the session itself (purged and created again under its id). On both
stores; each request is what ``request_at`` rebuilds at its seq."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from contextledger import ConcurrencyError, Ledger, Session, SessionNotFound
from contextledger.hooks import CompactContext

BUDGET = 400
CHARS = {"token_counter": "chars"}


def contents(request: list[dict[str, object]]) -> str:
    return "\n".join(str(m.get("content")) for m in request)


async def with_view(ledger: Ledger, texts: list[str]) -> tuple[Session, str]:
    """A handle on session "s" holding ``texts``, its request view built (cached), and
    that view's contents."""
    mine = await ledger.session("s", model="gpt-4o", config=CHARS)
    await mine.add_messages([{"role": "user", "content": t} for t in texts])
    return mine, contents(await mine.get_messages_for_request(BUDGET))


async def test_a_session_purged_and_created_again_is_never_served_from_a_handle(
    ledger: Ledger,
) -> None:
    mine, view = await with_view(
        ledger, [f"SECRET-OLD note {i} about the cache" for i in range(30)]
    )
    assert "SECRET-OLD" in view
    await ledger.store.purge("s", "asked to forget")
    again = await ledger.session("s", model="gpt-4o", config=CHARS)
    await again.add_messages([{"role": "user", "content": f"new {i}"} for i in range(5)])
    # the handle's next request is refused as its next append would be
    with pytest.raises(SessionNotFound):
        await mine.get_messages_for_request(BUDGET)
    with pytest.raises(SessionNotFound):
        await mine.add_message({"role": "user", "content": "hello"})
    # refresh takes the session as it is now: nothing of the purged one comes back
    await mine.refresh()
    request = await mine.get_messages_for_request(BUDGET)
    assert "SECRET-OLD" not in contents(request) and "new 4" in contents(request)
    assert request == await mine.request_at(mine.request_seq, token_budget=BUDGET)
    await mine.add_message({"role": "user", "content": "hello from the old handle"})
    assert "hello from the old handle" in contents(await mine.get_messages_for_request(BUDGET))
    await again.add_message({"role": "user", "content": "and from the new one"})
    request = await mine.get_messages_for_request(BUDGET)
    assert "SECRET-OLD" not in contents(request)
    assert "and from the new one" in contents(request)
    assert request == await mine.request_at(mine.request_seq, token_budget=BUDGET)


async def test_a_session_purged_and_grown_past_the_handle_is_refused_too(
    ledger: Ledger,
) -> None:
    mine, _ = await with_view(ledger, [f"SECRET-OLD {i}" for i in range(3)])
    await ledger.store.purge("s", "asked to forget")
    again = await ledger.session("s", model="gpt-4o", config=CHARS)
    await again.add_messages([{"role": "user", "content": f"new {i}"} for i in range(10)])
    assert again.head > mine.head  # past what the handle knew: no head went back
    with pytest.raises(SessionNotFound):
        await mine.get_messages_for_request(BUDGET)


async def test_settings_and_model_another_handle_records_are_the_next_requests(
    ledger: Ledger,
) -> None:
    mine, _ = await with_view(ledger, [f"note {i} on the {i % 7} cache shard" for i in range(60)])
    theirs = await ledger.session("s")
    await theirs.update_config({"recall": {"share": 0.35}})
    await theirs.set_model("gpt-4o-mini")
    await mine.add_message({"role": "user", "content": "which shard held note 12?"})
    request = await mine.get_messages_for_request(BUDGET)
    assert mine.config.recall.share == 0.35 and mine.model == "gpt-4o-mini"
    assert request == await mine.request_at(mine.request_seq, token_budget=BUDGET)
    assert request == await (await ledger.session("s")).get_messages_for_request(BUDGET)
    # and without an append of its own in between: the request reads the row first
    await theirs.update_config({"recall": {"share": 0.2}})
    request = await mine.get_messages_for_request(BUDGET)
    assert mine.config.recall.share == 0.2
    assert request == await mine.request_at(mine.request_seq, token_budget=BUDGET)
    # refresh takes them too, and keeps what this handle already holds otherwise
    await theirs.update_config({"recall": {"share": 0.25}})
    await mine.refresh()
    assert mine.config.recall.share == 0.25


async def test_two_compactions_at_once_one_applies_the_other_is_a_conflict_to_retry(
    pg_dsn: str,
) -> None:
    # Each plans from the view it read; the second to write names items the first took
    # out: a retryable conflict, nothing written (it was an "invalid argument" once).
    async with Ledger.open(pg_dsn) as here, Ledger.open(pg_dsn) as there:
        outcomes: list[object] = []
        for n in range(4):
            mine = await here.session(f"c{n}", model="gpt-4o", config=CHARS)
            await mine.add_messages(
                [{"role": "user", "content": f"note {i} " + "x" * 80} for i in range(120)]
            )
            theirs = await there.session(f"c{n}")
            done = await asyncio.gather(
                mine.compact("truncate", token_budget=3000),
                theirs.compact("truncate", token_budget=2500),
                return_exceptions=True,
            )
            for handle, result in zip((mine, theirs), done, strict=True):
                if isinstance(result, BaseException):
                    assert isinstance(result, ConcurrencyError) and result.is_retryable
                    assert await handle.compact("truncate", token_budget=2500) >= 0
                else:
                    assert isinstance(result, int)
            outcomes.extend(done)
        assert any(isinstance(r, ConcurrencyError) for r in outcomes)  # (the race was run)


async def test_an_auto_compaction_another_writer_beat_leaves_the_append_standing(
    ledger: Ledger,
) -> None:
    # The other writer compacts between this handle's read of the view and its record (in
    # the pre-compact hook, called in between): the append that triggered the automatic
    # compaction stands, its compaction is dropped, the view is the other's.
    config = {**CHARS, "auto_compact": True, "max_tokens": 3000}
    mine = await ledger.session("auto", model="gpt-4o", config=config)
    theirs = await ledger.session("auto")
    raced: list[int] = []

    async def beaten(context: CompactContext) -> None:
        if not raced:
            raced.append(await theirs.compact("truncate", token_budget=1500))

    mine.pre_compact = beaten
    for i in range(60):
        await mine.add_message({"role": "user", "content": f"mine {i} " + "x" * 400})
    assert raced and raced[0] > 0  # the other compaction ran in between, and applied
    assert (await mine.get_messages())[-1]["content"].startswith("mine 59")
    assert (await mine.usage()).tokens <= 3000


async def rollback_race(mine: Session, theirs: Session) -> tuple[Any, list[int]]:
    """``theirs`` rolls back to a checkpoint of ``mine`` while ``mine`` builds a request
    (after its view was planned, before recall searched: in the hook the planner's pass
    announces); ``mine``'s turns go on until it has. The request, and the rollback's seq."""
    await mine.add_messages(
        [
            {"role": "user", "content": f"the {w} gateway port is {4000 + i}"}
            for i, w in enumerate(["orchard", "quokka", "ledger", "canary"] * 15)
        ]
    )
    mark = await mine.checkpoint("early")
    await mine.add_messages(
        [
            {"role": "user", "content": f"later the quokka port moved to {5000 + i}"}
            for i in range(30)
        ]
    )
    await mine.get_messages_for_request(BUDGET)
    rolled: list[int] = []

    async def roll_back(event: str, data: object) -> None:
        if not rolled:
            rolled.append(await theirs.rollback(mark))

    mine.hooks.on("context:pre_compact", roll_back)
    request: Any = None
    for i in range(200):
        await mine.add_message({"role": "user", "content": f"which quokka port now? {i}"})
        request = await mine.get_messages_for_request(BUDGET)
        if rolled:
            break
    return request, rolled


async def test_a_rollback_between_a_requests_plan_and_its_search_rebuilds_it(
    ledger: Ledger,
) -> None:
    # Another writer's rollback lands while this handle builds a request: after its view
    # was planned, before recall searched (here: in the hook the planner's pass announces).
    # The search would take the new branch's messages for a request planned on the old
    # one, a block request_at could not rebuild; the request is built again on the head.
    # (Another handle here; from another process it lands the same way.)
    mine = await ledger.session("rb", model="gpt-4o", config=CHARS)
    # (the other handle's rollback goes through this store: the chain tip it knows moves,
    # so on PostgreSQL the request catches up, and the catch-up reads the branch; from
    # another process the request needs none: the test below)
    request, rolled = await rollback_race(mine, await ledger.session("rb"))
    assert rolled  # (the race was run)
    assert request == await mine.request_at(mine.request_seq, token_budget=BUDGET)
    assert mine.request_seq >= rolled[0]  # built again, on the branch after the rollback


async def test_a_rollback_after_a_requests_plan_leaves_the_request_at_its_seq(
    pg_dsn: str,
) -> None:
    # The same race from another process where the request needs no catch-up (its
    # postings came with the handle's own appends, ``warm.py``): nothing reads the branch
    # after the plan, so the request is the one at the seq it was planned at, on the
    # branch as of that seq (as if the rollback had landed just after it), and request_at
    # rebuilds it; the handle's next request is on the branch after the rollback. (A
    # rollback through the same store moves the chain tip the store knows: that request
    # catches up, and is built again as above.)
    async with Ledger.open(pg_dsn) as ledger, Ledger.open(pg_dsn) as other:
        mine = await ledger.session("rb", model="gpt-4o", config=CHARS)
        request, rolled = await rollback_race(mine, await other.session("rb"))
        assert rolled  # (the race was run)
        assert mine.request_seq < rolled[0]
        assert request == await mine.request_at(mine.request_seq, token_budget=BUDGET)
        assert any("moved to 5029" in str(m["content"]) for m in request)  # the old branch
        await mine.add_message({"role": "user", "content": "and now?"})
        after = await mine.get_messages_for_request(BUDGET)
        assert mine.request_seq > rolled[0]
        assert not any("moved to" in str(m["content"]) for m in after)  # rolled back
        assert after == await mine.request_at(mine.request_seq, token_budget=BUDGET)


async def test_a_request_beside_its_own_handles_append_is_never_refused(pg_dsn: str) -> None:
    # The row a request reads first can be older than an append the same handle made
    # while it was read (the service shares one handle between clients; a background
    # summary appends too): that is no other chain (it once was refused, 7% of these).
    async with Ledger.open(pg_dsn) as ledger:
        for trial in range(100):
            mine = await ledger.session(f"own{trial}", model="gpt-4o", config=CHARS)
            await mine.add_messages([{"role": "user", "content": f"m {i}"} for i in range(5)])
            await mine.get_messages_for_request(BUDGET)
            append = asyncio.ensure_future(mine.add_message({"role": "user", "content": "next"}))
            for _ in range(trial % 5):
                await asyncio.sleep(0)
            request, _ = await asyncio.gather(mine.get_messages_for_request(BUDGET), append)
            assert "m 4" in contents(request)
