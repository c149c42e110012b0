"""Two service instances behind one session: a client resending its whole history to
whichever instance a balancer picks records each message once, whatever the other
instance wrote since (the prefix a process remembers is checked against the ledger's
own record through the idempotency keys of the positions)."""

from __future__ import annotations

import random
from typing import Any

from contextledger import Ledger
from contextledger.hooks import MESSAGE_ADDED
from contextledger.http.settings import Settings
from tests.fakellm import FakeLLM, ok, tool_call
from tests.integration.service_support import Running, branch, client, metric, running_service


async def appended(svc: Running) -> float:
    """The messages ``svc`` counted as appended (its ``/metrics``)."""
    count = metric((await svc.client.get("/metrics")).text, "contextledger_appends_total")
    assert count is not None
    return count


async def _ask(
    svc: Running, history: list[Any], *, stream: bool, session: str = "both"
) -> dict[str, Any]:
    """One call, and the reply as the client keeps it in its history."""
    oai = client(svc, session)
    if not stream:
        reply = await oai.chat.completions.create(model="m", messages=history)
        return reply.choices[0].message.model_dump()
    chunks = await oai.chat.completions.create(model="m", messages=history, stream=True)
    text = "".join([c.choices[0].delta.content or "" async for c in chunks if c.choices])
    return {"role": "assistant", "content": text}


async def test_a_client_moving_between_two_instances_records_each_message_once(
    pg_dsn: str, fake: FakeLLM
) -> None:
    rng = random.Random(7)
    rounds = 16
    fake.script(
        "m",
        [
            tool_call("lookup", {"n": i}, call_id=f"call_{i}") if i % 5 == 2 else ok(f"a{i}")
            for i in range(rounds)
        ],
    )
    settings = Settings(dsn=pg_dsn, migrate=False, upstream_api_base=fake.base_url)
    async with running_service(settings) as one, running_service(settings) as two:
        history: list[Any] = [{"role": "system", "content": "Be brief."}]
        for i in range(rounds):
            if history[-1].get("tool_calls"):  # the tool's result, then the next call
                call = history[-1]["tool_calls"][0]
                history.append({"role": "tool", "tool_call_id": call["id"], "content": f"r{i}"})
            else:
                history.append({"role": "user", "content": f"u{i}"})
            svc = rng.choice((one, two))  # the next call may come before the last record
            calls = bool(i % 5 == 2)
            history.append(await _ask(svc, history, stream=not calls and rng.random() < 0.5))
        for svc in (one, two):
            await svc.app.state.tenants.settled()
        counted = [await appended(svc) for svc in (one, two)]
        stored = await branch(one, pg_dsn, "both")
    async with Ledger.open(pg_dsn) as ledger:
        kinds = [e.type async for e in (await ledger.session("both", create=False)).events()]
    # each message appended once, and nothing rewritten to mend a double record
    assert kinds.count("message.appended") == len(history), kinds
    assert set(kinds) == {"session.created", "message.appended"}, set(kinds)
    assert len(stored) == len(history)
    # and each appended by one instance only: none found held after a round trip to try
    assert sum(counted) == len(history) and all(counted)
    for mine, kept in zip(history, stored, strict=True):
        assert (mine["role"], mine.get("content") or "") == (kept["role"], kept["content"] or "")
        assert bool(mine.get("tool_calls")) == bool(kept.get("tool_calls"))


async def test_an_edited_reply_sent_to_an_instance_that_is_behind_rewrites_the_history(
    pg_dsn: str, fake: FakeLLM
) -> None:
    # The first instance last wrote after a0; the second recorded u1 and a1 since. The
    # client edits a1 and asks the first: its own idea of the branch is behind, so it
    # must compare with the ledger (the edit is a rewrite), not append after what it
    # never saw (the original a1 followed by the edited one).
    fake.script("m", [ok("a0"), ok("a1"), ok("a2")])
    settings = Settings(dsn=pg_dsn, migrate=False, upstream_api_base=fake.base_url)
    async with running_service(settings) as one, running_service(settings) as two:
        history: list[Any] = [{"role": "user", "content": "u0"}]
        history.append(await _ask(one, history, stream=False))
        history.append({"role": "user", "content": "u1"})
        history.append(await _ask(two, history, stream=False))
        await two.app.state.tenants.settled()
        history[-1] = {"role": "assistant", "content": "a1, said better"}
        history.append({"role": "user", "content": "u2"})
        history.append(await _ask(one, history, stream=False))
        await one.app.state.tenants.settled()
        stored = await branch(one, pg_dsn, "both")
    assert [m["content"] for m in stored] == ["u0", "a0", "u1", "a1, said better", "u2", "a2"]


async def test_a_session_that_compacts_as_it_grows_is_not_taken_for_another_writer(
    pg_dsn: str, fake: FakeLLM
) -> None:
    # Appends that cross the compaction threshold write a checkpoint and the compaction
    # after the message: the handle's head moves past the message's seq by its own hand.
    # That is no other writer: the request is answered, each message appended once.
    fake.script("m", [ok("done")])
    settings = Settings(dsn=pg_dsn, migrate=False, upstream_api_base=fake.base_url)
    async with running_service(settings) as one:
        config = {"auto_compact": True, "max_tokens": 200, "keep_recent": 2}
        created = await one.client.post(
            "/v1/sessions", json={"session_id": "grows", "model": "m", "config": config}
        )
        assert created.status_code == 201
        history: list[Any] = [{"role": "user", "content": f"note {i}"} for i in range(121)]
        reply = await _ask(one, history, stream=False, session="grows")
        await one.app.state.tenants.settled()
        counted = await appended(one)
    assert reply["content"] == "done"
    assert counted == len(history) + 1  # and the reply
    async with Ledger.open(pg_dsn) as ledger:
        session = await ledger.session("grows", create=False)
        kinds = [e.type async for e in session.events()]
    assert kinds.count("message.appended") == len(history) + 1
    assert "compaction.applied" in kinds  # (it did compact along the way)


async def test_a_message_another_process_writes_between_two_of_a_request_is_seen(
    pg_dsn: str, fake: FakeLLM
) -> None:
    # A request brings two new messages; after the first, another process appends to the
    # session (made certain by a hook on the first append). The second is pinned to where
    # the first left the head: refused, the history is compared again and recorded as
    # the client holds it (a rewrite, as any history that no longer matches the branch),
    # not appended after the other process's message.
    fake.script("m", [ok("a0"), ok("a1")])
    settings = Settings(dsn=pg_dsn, migrate=False, upstream_api_base=fake.base_url)
    async with running_service(settings) as one, Ledger.open(pg_dsn) as elsewhere:
        history: list[Any] = [{"role": "user", "content": "u0"}]
        history.append(await _ask(one, history, stream=False, session="between"))
        handle = await one.app.state.tenants.session("local", "between")
        theirs = await elsewhere.session("between", create=False)
        written: list[int | None] = []

        async def meanwhile(_event: str, _data: Any) -> None:
            if not written:
                written.append(await theirs.add_message({"role": "user", "content": "z"}))

        handle.hooks.on(MESSAGE_ADDED, meanwhile)
        history += [{"role": "user", "content": "x"}, {"role": "user", "content": "y"}]
        history.append(await _ask(one, history, stream=False, session="between"))
        await one.app.state.tenants.settled()
        stored = await branch(one, pg_dsn, "between")
    assert written and [m["content"] for m in stored] == ["u0", "a0", "x", "y", "a1"]


async def test_a_history_sent_again_after_a_rollback_is_recorded_on_the_new_branch(
    pg_dsn: str, fake: FakeLLM
) -> None:
    # The session is rolled back past u1 and a1; the client, which never saw that, sends
    # its history again and the model answers as before. u1 and a1 come back at the same
    # places with the same content: their position keys are held on the branch left
    # behind, which must not pass for "already recorded" (nothing would be written, and
    # each request would compare again until a 409).
    fake.script("m", [ok("a0"), ok("a1"), ok("a1"), ok("a2")])
    settings = Settings(dsn=pg_dsn, migrate=False, upstream_api_base=fake.base_url)
    async with running_service(settings) as one:
        history: list[Any] = [{"role": "user", "content": "u0"}]
        history.append(await _ask(one, history, stream=False, session="back"))
        before_u1 = len(history)
        history += [{"role": "user", "content": "u1"}]
        history.append(await _ask(one, history, stream=False, session="back"))
        await one.app.state.tenants.settled()
        # seq 1 created the session, 2 and 3 are u0 and a0
        rolled = await one.client.post("/v1/sessions/back/rollback", json={"to": 3})
        assert rolled.status_code == 200, rolled.text
        assert [m["content"] for m in await branch(one, pg_dsn, "back")] == ["u0", "a0"]
        again = await _ask(one, history[: before_u1 + 1], stream=False, session="back")
        assert again["content"] == "a1"
        history += [{"role": "user", "content": "u2"}]
        history.append(await _ask(one, history, stream=False, session="back"))
        await one.app.state.tenants.settled()
        stored = await branch(one, pg_dsn, "back")
    assert [m["content"] for m in stored] == ["u0", "a0", "u1", "a1", "u2", "a2"]
