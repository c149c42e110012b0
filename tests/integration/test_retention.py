"""Retention against the real stores: dry run, erase and purge by idleness, audited."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import pytest_asyncio

from contextledger import KeyRing, Ledger
from contextledger.core.events import MessageAppended, SessionCreated
from contextledger.retention import RetentionPolicy, apply, plan
from tests.integration.conftest import dsn_for

KEK = bytes(range(32))
NOW = datetime.now(UTC)


async def seed(ledger: Ledger, session_id: str, days_ago: float) -> None:
    """A session whose last event is ``days_ago`` old (the store's own write path)."""
    at = NOW - timedelta(days=days_ago)
    await ledger.store.create_session(session_id, SessionCreated("gpt-4o"), created_at=at)
    message = MessageAppended({"role": "user", "content": f"content of {session_id}"}, 5)
    await ledger.store.append(session_id, [message], created_at=at)


@pytest_asyncio.fixture(params=["postgres", "memory"])
async def sealed(request: pytest.FixtureRequest) -> AsyncIterator[Ledger]:
    dsn = "memory://"
    if request.param == "postgres":
        dsn = dsn_for(request.getfixturevalue("postgresql"))
    async with Ledger.open(dsn, keyring=KeyRing(KEK)) as led:
        yield led


async def test_dry_run_then_erase_then_purge(sealed: Ledger) -> None:
    await seed(sealed, "old", 40)
    await seed(sealed, "older", 200)
    await seed(sealed, "fresh", 2)
    policy = RetentionPolicy(erase_after_days=30, purge_after_days=180)

    dry = await apply(sealed, policy, dry_run=True)
    assert [(a.session_id, a.action, a.done) for a in dry] == [
        ("older", "purge", False),
        ("old", "erase", False),
    ]
    assert await sealed.erasures() == [] and await sealed.store.purges() == []  # type: ignore[attr-defined]
    assert (await (await sealed.session("old")).get_messages())[0]["content"] == "content of old"

    done = await apply(sealed, policy)
    assert [(a.session_id, a.action, a.done) for a in done] == [
        ("older", "purge", True),
        ("old", "erase", True),
    ]
    (erasure,) = await sealed.erasures()
    assert erasure.session_id == "old" and erasure.actor == "retention"
    assert erasure.reason.startswith("retention: erase_after_days=30, idle 40.")
    (purge,) = await sealed.store.purges()  # type: ignore[attr-defined]
    assert purge["session_id"] == "older" and "purge_after_days=180" in purge["reason"]
    assert (await sealed.verify("old")).ok
    assert await plan(sealed, policy) == []  # idempotent: nothing left to do
    assert [i.session_id for i in await sealed.sessions()] == ["old", "fresh"]
    # later, the erased session's purge comes due too
    later = await apply(sealed, policy, now=NOW + timedelta(days=150))
    assert [(a.session_id, a.action) for a in later] == [("old", "purge"), ("fresh", "erase")]
    assert [i.session_id for i in await sealed.sessions()] == ["fresh"]


async def test_an_unsealed_session_is_listed_not_erased(pg_dsn: str) -> None:
    async with Ledger.open(pg_dsn, keyring=None) as plain:
        await seed(plain, "clear", 40)
    async with Ledger.open(pg_dsn, keyring=KeyRing(KEK)) as ledger:
        (action,) = await apply(ledger, RetentionPolicy(erase_after_days=30))
        assert action.action == "skip" and "purge_after_days" in action.why
        assert await ledger.erasures() == []
        assert await ledger.store.purges() == []  # type: ignore[attr-defined]


async def fork(ledger: Ledger, parent: str, session_id: str, days_ago: float) -> None:
    """A fork of ``parent`` at its head, its own last event ``days_ago`` old."""
    at = NOW - timedelta(days=days_ago)
    head = (await ledger.store.session_info(parent)).head
    await ledger.store.fork_session(session_id, parent, head, created_at=at, metadata={})
    message = MessageAppended({"role": "user", "content": f"content of {session_id}"}, 5)
    await ledger.store.append(session_id, [message], created_at=at)


async def test_a_fork_in_use_keeps_what_it_stands_on(sealed: Ledger) -> None:
    """A session is idle when it and the forks standing on it are: erasing or purging
    an idle parent would take a fork in use with it (an erasure's cascade), or be
    refused while the fork stands (a purge), and stop the whole run."""
    await seed(sealed, "root", 40)
    await fork(sealed, "root", "root-live", 1)
    await seed(sealed, "gone", 40)
    await fork(sealed, "gone", "gone-f", 35)
    await fork(sealed, "gone-f", "gone-f-f", 33)

    erase = RetentionPolicy(erase_after_days=30)
    assert [(a.session_id, a.action) for a in await plan(sealed, erase)] == [
        ("gone-f-f", "erase"),
        ("gone-f", "erase"),
        ("gone", "erase"),
    ]
    purge = RetentionPolicy(purge_after_days=30)
    done = await apply(sealed, purge)
    assert [(a.session_id, a.action, a.done) for a in done] == [
        ("gone-f-f", "purge", True),  # the forks first: a purge is refused under them
        ("gone-f", "purge", True),
        ("gone", "purge", True),
    ]
    assert [i.session_id for i in await sealed.sessions()] == ["root", "root-live"]
    assert await sealed.erasures() == []
    live = await sealed.session("root-live", create=False)
    assert [m["content"] for m in await live.get_messages()] == [
        "content of root",
        "content of root-live",
    ]
    # a month on, both idle: the fork goes before what it stands on
    later = await apply(sealed, RetentionPolicy(purge_after_days=30), now=NOW + timedelta(days=40))
    assert [a.session_id for a in later] == ["root-live", "root"]
    assert await sealed.sessions() == []


CLI = str(Path(sys.executable).with_name("contextledger"))


def test_cli_dry_run_and_apply(pg_dsn: str) -> None:
    import asyncio

    async def go() -> None:
        async with Ledger.open(pg_dsn, keyring=KeyRing(KEK)) as ledger:
            await seed(ledger, "idle", 10)
            await seed(ledger, "busy", 0)

    asyncio.run(go())
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONTEXTLEDGER_")}
    env.update(CONTEXTLEDGER_DSN=pg_dsn, COLUMNS="200")

    def run(*args: str, **extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [CLI, "retention", "apply", *args],
            capture_output=True,
            text=True,
            env={**env, **extra},
            timeout=120,
            check=False,
        )

    none = run("--dry-run")
    assert none.returncode == 2 and "--erase-after-days" in none.stderr
    bad = run("--dry-run", CONTEXTLEDGER_RETENTION='{"local": {"erase_after_days": 0}}')
    assert bad.returncode == 2 and "[INVALID_CONFIG]" in bad.stderr
    other = run("--dry-run", CONTEXTLEDGER_RETENTION='{"acme": {"erase_after_days": 7}}')
    assert other.returncode == 2 and "tenant 'local'" in other.stderr
    dry = run("--dry-run", "--json", CONTEXTLEDGER_RETENTION='{"local": {"erase_after_days": 7}}')
    assert dry.returncode == 0, dry.stderr
    out = json.loads(dry.stdout)
    assert out["dry_run"] and [a["session_id"] for a in out["actions"]] == ["idle"]
    done = run("--erase-after-days", "7", "--json")  # erasing needs no KEK
    assert done.returncode == 0, done.stderr
    assert [
        (a["session_id"], a["action"], a["done"]) for a in json.loads(done.stdout)["actions"]
    ] == [("idle", "erase", True)]
    again = run("--erase-after-days", "7")
    assert again.returncode == 0 and "0 session(s)" in again.stdout


async def test_the_service_applies_policies_on_a_schedule(
    pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import asyncio

    from contextledger.errors import ConfigError
    from contextledger.http.app import create_app
    from contextledger.http.settings import Settings, parse_setting
    from tests.integration.service_support import running_service

    with pytest.raises(ConfigError, match="whole number"):
        parse_setting("retention", '{"local": {"erase_after_days": -1}}')
    with pytest.raises(ConfigError):
        create_app(Settings(dsn=pg_dsn, retention={"local": {"keep_days": 3}}))
    async with Ledger.open(pg_dsn, keyring=KeyRing(KEK)) as ledger:
        await seed(ledger, "stale", 40)
        await seed(ledger, "live", 1)
    monkeypatch.delenv("CONTEXTLEDGER_KEK", raising=False)  # erasing needs no KEK
    policy = parse_setting("retention", '{"local": {"erase_after_days": 30}}')
    settings = Settings(dsn=pg_dsn, migrate=False, retention=policy, retention_interval=0.2)
    async with running_service(settings) as running:
        for _ in range(100):
            gone = await running.client.get("/v1/sessions/stale")
            if gone.status_code == 410:
                break
            await asyncio.sleep(0.1)
        assert gone.status_code == 410
        assert (await running.client.get("/v1/sessions/live")).status_code == 200
    async with Ledger.open(pg_dsn) as ledger:
        (erasure,) = await ledger.erasures()  # every pass since found nothing more to do
        assert erasure.session_id == "stale" and erasure.actor == "retention"


def test_retention_on_a_connection_that_sees_every_tenant_is_refused(pg_dsn: str) -> None:
    """The command run as a superuser (or the tables' owner) without a tenant: row-level
    security does not hold that role, so it listed every tenant's sessions and purged
    them under the `local` policy (two tenants' `s` at once, audited as `local`'s).
    Refused with the way to do it; per tenant, as the service role, it acts on one."""
    import asyncio

    from contextledger.store.dsn import asyncpg_dsn, with_user

    service = with_user(asyncpg_dsn(pg_dsn), "contextledger_service")

    async def go() -> None:
        for tenant in ("alpha", "local"):
            async with Ledger.open(service, tenant=tenant, keyring=KeyRing(KEK)) as ledger:
                await seed(ledger, "s", 40)

    asyncio.run(go())
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONTEXTLEDGER_")}
    env["COLUMNS"] = "200"

    def run(dsn: str, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [CLI, "--dsn", dsn, *args, "retention", "apply", "--purge-after-days", "30"],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
            check=False,
        )

    refused = run(pg_dsn)
    assert refused.returncode == 2 and "[INVALID_CONFIG]" in refused.stderr
    assert "'alpha'" in refused.stderr and "--tenant" in refused.stderr
    dry = subprocess.run(
        [CLI, "--dsn", pg_dsn, "retention", "apply", "--purge-after-days", "30", "--dry-run"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert dry.returncode == 2  # a dry run would list other tenants' sessions as this one's

    async def sessions() -> list[tuple[str, str]]:
        import asyncpg

        conn = await asyncpg.connect(asyncpg_dsn(pg_dsn))
        try:
            rows = await conn.fetch(
                "SELECT tenant_id, session_id FROM contextledger.sessions ORDER BY 1"
            )
            return [(r[0], r[1]) for r in rows]
        finally:
            await conn.close()

    assert asyncio.run(sessions()) == [("alpha", "s"), ("local", "s")]  # nothing purged
    one = run(service, "--tenant", "alpha")
    assert one.returncode == 0, one.stderr
    assert asyncio.run(sessions()) == [("local", "s")]
