"""Issue 26: behind PgBouncer in transaction mode, with two service processes, tenants
stay apart. ``contextledger serve --workers 2 --pgbouncer`` as deployed (its own
process), Debian's pgbouncer in front of the test PostgreSQL with few server
connections, two tenants writing the same session ids at once through REST and the
proxy: every row lands under its own tenant, every read sees only its own."""

from __future__ import annotations

import asyncio
import signal
import subprocess
from pathlib import Path

import asyncpg
import httpx
import psutil
import pytest

from contextledger.store.dsn import asyncpg_dsn
from tests.fakellm import FakeLLM
from tests.integration.conftest import PG_HOST, PG_PORT
from tests.integration.pgbouncer import running_pgbouncer
from tests.integration.service_support import (
    free_port,
    new_key,
    serve_process,
    wait_ready,
)

SESSIONS = 10
APPENDS = 4


def _workers(proc: subprocess.Popen[bytes]) -> int:
    children = psutil.Process(proc.pid).children()
    return sum(1 for c in children if "spawn_main" in " ".join(c.cmdline()))


async def _tenant_work(c: httpx.AsyncClient, key: str, name: str, i: int) -> None:
    h = {"Authorization": f"Bearer {key}"}
    r = await c.post("/v1/sessions", json={"session_id": f"s{i}"}, headers=h)
    assert r.status_code == 201, r.text
    for j in range(APPENDS):
        message = {"role": "user", "content": f"{name} {i} {j}"}
        r = await c.post(f"/v1/sessions/s{i}/messages", json={"message": message}, headers=h)
        assert r.status_code == 201, r.text
    chat = {"model": "m", "messages": [{"role": "user", "content": f"{name} asks {i}"}]}
    r = await c.post("/v1/chat/completions", json=chat, headers={**h, "X-Session-Id": f"p{i}"})
    assert r.status_code == 200, r.text


async def test_two_workers_behind_pgbouncer_keep_tenants_apart(
    pg_dsn: str, fake: FakeLLM, tmp_path: Path
) -> None:
    keys = {"alpha": await new_key(pg_dsn, "alpha"), "beta": await new_key(pg_dsn, "beta")}
    conn = await asyncpg.connect(asyncpg_dsn(pg_dsn))
    try:
        dbname = await conn.fetchval("SELECT current_database()")
        superuser = await conn.fetchval("SELECT current_user")
    finally:
        await conn.close()
    with running_pgbouncer(PG_HOST, PG_PORT, [superuser, "contextledger_service"]) as bouncer:
        # why the tenant cannot travel as a startup parameter here: PgBouncer refuses it
        with pytest.raises(asyncpg.PostgresError, match="unsupported startup parameter"):
            await asyncpg.connect(
                bouncer.dsn(superuser, dbname), server_settings={"contextledger.tenant": "a"}
            )
        port, log = free_port(), tmp_path / "serve.log"
        proc = serve_process(
            "--dsn",
            bouncer.dsn(superuser, dbname),
            "--workers",
            "2",
            "--pgbouncer",
            "--no-migrate",
            "--port",
            str(port),
            "--pool-size",
            "3",
            "--upstream-api-base",
            fake.base_url,
            log=log,
        )
        url = f"http://127.0.0.1:{port}"
        try:
            await wait_ready(url, proc, log, seconds=60)
            assert _workers(proc) == 2
            async with httpx.AsyncClient(base_url=url, timeout=60) as c:
                await asyncio.gather(
                    *(
                        _tenant_work(c, keys[name], name, i)
                        for i in range(SESSIONS)
                        for name in ("alpha", "beta")
                    )
                )
                ha = {"Authorization": f"Bearer {keys['alpha']}"}
                hb = {"Authorization": f"Bearer {keys['beta']}"}
                r = await c.post("/v1/sessions", json={"session_id": "alpha-only"}, headers=ha)
                assert r.status_code == 201
                for _ in range(8):  # whichever worker and server connection answers
                    assert (await c.get("/v1/sessions/alpha-only", headers=hb)).status_code == 404
                    r = await c.delete(
                        "/v1/sessions/alpha-only", params={"reason": "x"}, headers=hb
                    )
                    assert r.status_code == 404
                assert (await c.get("/v1/sessions/alpha-only", headers=ha)).status_code == 200
                await c.delete("/v1/sessions/alpha-only", params={"reason": "done"}, headers=ha)
                for name, key in keys.items():
                    h = {"Authorization": f"Bearer {key}"}
                    listed = (await c.get("/v1/sessions", headers=h)).json()["items"]
                    assert sorted(s["session_id"] for s in listed) == sorted(
                        [f"s{i}" for i in range(SESSIONS)] + [f"p{i}" for i in range(SESSIONS)]
                    )
                    for i in range(SESSIONS):
                        r = await c.get(f"/v1/sessions/s{i}/messages", headers=h)
                        assert [m["content"] for m in r.json()["messages"]] == [
                            f"{name} {i} {j}" for j in range(APPENDS)
                        ]
                        r = await c.get(f"/v1/sessions/p{i}/messages", headers=h)
                        first = r.json()["messages"][0]
                        assert first == {"role": "user", "content": f"{name} asks {i}"}
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    assert "prepared statement" not in log.read_text()
    # as the owner sees the rows: each under the tenant whose words it holds, none 'local'
    conn = await asyncpg.connect(asyncpg_dsn(pg_dsn))
    try:
        rows = await conn.fetch(
            "SELECT tenant_id, data -> 'message' ->> 'content' AS content"
            " FROM contextledger.events WHERE data -> 'message' ->> 'role' = 'user'"
        )
        tenants = await conn.fetch("SELECT DISTINCT tenant_id FROM contextledger.sessions")
    finally:
        await conn.close()
    assert len(rows) == 2 * SESSIONS * (APPENDS + 1)
    wrong = [r for r in rows if not r["content"].startswith(r["tenant_id"] + " ")]
    assert wrong == []
    assert sorted(r["tenant_id"] for r in tenants) == ["alpha", "beta"]
