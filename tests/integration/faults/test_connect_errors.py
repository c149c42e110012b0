"""Connection failures say what is wrong, on the fault suite's own throwaway server.

A wrong password is ``LedgerCredentialsRejected`` (``CREDENTIALS_REJECTED``), naming what
to check and where the DSN came from — never "unreachable", so the Amplifier mount's
``on_unreachable: memory`` does not hide it; an unknown host, a closed port and a server
that never answers each get their own code. Over HTTP the store's failures keep a generic
body: 503 with ``Retry-After`` when retrying helps, 503 without it when it does not.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest
import pytest_asyncio
from amplifier_core.testing import MockCoordinator
from structlog.testing import capture_logs

from contextledger import Ledger
from contextledger.amplifier import mount
from contextledger.errors import LedgerCredentialsRejected, LedgerRefused, LedgerUnavailable
from contextledger.http.settings import Settings
from contextledger.store.dsn import asyncpg_dsn
from tests.integration.faults.support import admin, server_dsn
from tests.integration.service_support import running_service

RIGHT = "right-horse-battery"


@pytest_asyncio.fixture
async def password_role(server: Any) -> AsyncIterator[str]:
    """A login role whose password the server checks (scram), whatever its other rules
    trust: its own ``pg_hba.conf`` lines go first, and everything is undone after."""
    role = f"carry_pw_{uuid.uuid4().hex[:8]}"
    conn = await asyncpg.connect(asyncpg_dsn(server_dsn(server)))
    hba = Path(await conn.fetchval("SHOW hba_file"))
    original = await asyncio.to_thread(hba.read_text, encoding="utf-8")
    try:
        await conn.execute(f"CREATE ROLE {role} LOGIN PASSWORD '{RIGHT}'")
        rule = f"local all {role} scram-sha-256\nhost all {role} all scram-sha-256\n"
        await asyncio.to_thread(hba.write_text, rule + original, encoding="utf-8")
        await conn.execute("SELECT pg_reload_conf()")
        yield role
    finally:
        await asyncio.to_thread(hba.write_text, original, encoding="utf-8")
        await conn.execute("SELECT pg_reload_conf()")
        await conn.execute(f"DROP ROLE IF EXISTS {role}")
        await conn.close()


def _dsn(server: Any, user: str, password: str) -> str:
    info = server.get_postmaster_info()
    return f"postgresql://{user}:{password}@/postgres?host={info.socket_dir}&port={info.port}"


async def test_the_role_logs_in_with_its_password_only(server: Any, password_role: str) -> None:
    """The control: the server really checks this role's password."""
    conn = await asyncpg.connect(asyncpg_dsn(_dsn(server, password_role, RIGHT)))
    assert await conn.fetchval("SELECT current_user") == password_role
    await conn.close()
    with pytest.raises(asyncpg.InvalidPasswordError):
        await asyncpg.connect(asyncpg_dsn(_dsn(server, password_role, "wrong")))


async def test_a_wrong_password_says_what_to_check(
    server: Any, password_role: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    dsn = _dsn(server, password_role, "wrong-password")
    with pytest.raises(LedgerCredentialsRejected) as info:
        await Ledger.open(dsn)
    err = info.value
    assert err.code == "CREDENTIALS_REJECTED" and not err.is_retryable
    assert isinstance(err, LedgerRefused) and not isinstance(err, LedgerUnavailable)
    text = str(err)
    assert "user and password" in text and "the dsn argument" in text
    assert password_role in text  # which user the server turned away
    assert "wrong-password" not in text  # the password never
    assert "Retry later" not in text and "server log" not in text
    monkeypatch.setenv("CONTEXTLEDGER_DSN", dsn)
    with pytest.raises(LedgerCredentialsRejected) as info:
        await Ledger.open()
    assert "$CONTEXTLEDGER_DSN" in str(info.value)


async def test_the_mount_does_not_fall_back_on_bad_credentials(
    server: Any, password_role: str
) -> None:
    coordinator = MockCoordinator()
    config = {"dsn": _dsn(server, password_role, "nope"), "on_unreachable": "memory"}
    with capture_logs() as logs, pytest.raises(LedgerCredentialsRejected):
        await mount(coordinator, config)
    assert not [e for e in logs if e["event"] == "ledger_unavailable_using_memory"]
    assert coordinator.mount_points["context"] is None


def test_the_cli_says_what_is_wrong(server: Any, password_role: str) -> None:
    env = {**os.environ, "CONTEXTLEDGER_DSN": _dsn(server, password_role, "nope")}
    done = subprocess.run(
        [sys.executable, "-m", "contextledger.cli", "sessions"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 2
    assert "[CREDENTIALS_REJECTED]" in done.stderr
    assert "$CONTEXTLEDGER_DSN" in done.stderr and "nope" not in done.stderr


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A loopback port that accepts TCP and never says a word (a firewall's black hole,
    as near as a test gets to one)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)
        yield sock.getsockname()[1]


async def test_host_refused_and_timeout_each_say_what_is_wrong(silent_port: int) -> None:
    with pytest.raises(LedgerUnavailable) as info:
        await Ledger.open("postgresql://u@no-such-host.invalid:5432/db")
    assert info.value.code == "HOST_NOT_FOUND"
    assert "does not resolve" in str(info.value) and "no-such-host.invalid" in str(info.value)
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        closed = sock.getsockname()[1]
    with pytest.raises(LedgerUnavailable) as info:
        await Ledger.open(f"postgresql://u@127.0.0.1:{closed}/db")
    assert info.value.code == "CONNECTION_REFUSED"
    assert "nothing accepts connections" in str(info.value)
    with pytest.raises(LedgerUnavailable) as info:
        await Ledger.open(f"postgresql://u@127.0.0.1:{silent_port}/db?connect_timeout=1")
    assert info.value.code == "TIMED_OUT"
    assert "did not answer in time" in str(info.value)


async def test_http_store_failures_are_503_retry_after_only_when_retryable(
    server: Any, scratch: str
) -> None:
    # every connection the service opens (as whichever role) gets a short statement timeout
    db = scratch.split("@/")[1].split("?")[0]
    await admin(scratch, f"ALTER DATABASE \"{db}\" SET statement_timeout = '300ms'")
    try:
        async with running_service(Settings(dsn=scratch, migrate=False)) as svc:
            c = svc.client
            assert (await c.post("/v1/sessions", json={"session_id": "h"})).status_code == 201
            blocker = await asyncpg.connect(asyncpg_dsn(scratch))
            try:  # refused, not retryable: the append waits on a lock past the timeout
                async with blocker.transaction():
                    await blocker.execute(
                        "SELECT 1 FROM contextledger.sessions WHERE session_id = 'h' FOR UPDATE"
                    )
                    refused = await c.post(
                        "/v1/sessions/h/messages",
                        json={"message": {"role": "user", "content": "x"}},
                    )
            finally:
                await blocker.close()
            server.stop()  # unavailable, retryable: the server is down
            try:
                down = await c.get("/v1/sessions/h/events")
            finally:
                server.start()
    finally:
        await admin(scratch, f'ALTER DATABASE "{db}" RESET statement_timeout')
    assert refused.status_code == 503, refused.text
    assert refused.json()["code"] == "STATEMENT_TIMEOUT"
    assert "retry-after" not in refused.headers
    assert down.status_code == 503, down.text
    assert down.json()["code"] in {"CONNECTION_LOST", "CONNECTION_REFUSED", "SERVER_STOPPING"}
    assert down.headers["retry-after"] == "2"
    for body in (refused.text, down.text):
        assert "postgresql://" not in body and "host=" not in body and "postgres@" not in body
