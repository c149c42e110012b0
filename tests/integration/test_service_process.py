"""``contextledger serve`` as deployed: its own process, flags after the command, SIGTERM."""

from __future__ import annotations

import asyncio
import json
import signal
from pathlib import Path

import httpx
import pytest

from contextledger import Ledger
from tests.integration.service_support import (
    appends_held,
    free_port,
    log_tail,
    serve_process,
    wait_ready,
)


def _user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


async def test_serve_takes_its_flags_after_the_command_and_drains_on_sigterm(
    pg_dsn: str, tmp_path: Path
) -> None:
    port, log = free_port(), tmp_path / "serve.log"
    proc = serve_process(
        "--dsn", pg_dsn, "--port", str(port), "--log-format", "console", "--no-migrate", log=log
    )
    url = f"http://127.0.0.1:{port}"
    try:
        await wait_ready(url, proc, log)
        async with httpx.AsyncClient(base_url=url, timeout=30) as c:
            assert (await c.post("/v1/sessions", json={"session_id": "p"})).status_code == 201
            await c.post("/v1/sessions/p/messages", json={"message": _user("warm")})

            def start() -> list[asyncio.Task[httpx.Response]]:
                body = [{"message": _user(str(i))} for i in range(4)]
                return [
                    asyncio.create_task(c.post("/v1/sessions/p/messages", json=b)) for b in body
                ]

            async with appends_held(pg_dsn, start) as sends:
                proc.send_signal(signal.SIGTERM)  # shutdown starts with the appends in flight
                await asyncio.sleep(0.3)
                assert proc.poll() is None  # still draining
            answers = await asyncio.gather(*sends)
        assert [r.status_code for r in answers] == [201] * 4
        # once drained, the process ends through SystemExit (atexit runs): 128 + SIGTERM
        assert await asyncio.to_thread(proc.wait, 30) == 128 + signal.SIGTERM
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    async with Ledger.open(pg_dsn) as ledger:
        session = await ledger.session("p", create=False)
        assert len(await session.get_messages()) == 5
    text = await asyncio.to_thread(log.read_text)
    lines = [ln for ln in text.splitlines() if "request" in ln and "/v1/sessions" in ln]
    assert lines, text[-2000:]
    for line in lines:  # --log-format console after the command: no JSON lines
        try:
            json.loads(line)
        except ValueError:
            continue
        raise AssertionError(f"a JSON log line: {line}")


def test_a_bad_flag_value_is_a_clear_error_and_nothing_starts(pg_dsn: str, tmp_path: Path) -> None:
    log = tmp_path / "serve.log"
    proc = serve_process("--dsn", pg_dsn, "--pool-size", "many", "--no-migrate", log=log)
    assert proc.wait(60) == 2
    assert "CONTEXTLEDGER_POOL_SIZE" in log.read_text()
    # a flag reaches the local-mode guard: beyond loopback without any API key, refused
    for dsn in (pg_dsn, "memory://"):  # memory:// holds no keys: loopback only too
        proc = serve_process("--dsn", dsn, "--host", "0.0.0.0", "--no-migrate", log=log)
        assert proc.wait(60) == 2
        assert "127.0.0.1" in log.read_text()
    # a service role that is a superuser would be no guard at all: refused at start
    proc = serve_process("--dsn", pg_dsn, "--service-role", "postgres", "--no-migrate", log=log)
    assert proc.wait(60) != 0
    assert "superuser or bypasses row-level security" in log.read_text()


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
async def test_a_signal_stops_the_embedded_postgresql_serve_started(
    tmp_path: Path, sig: signal.Signals
) -> None:
    """``ops/serve`` with no DSN starts the embedded server; SIGTERM (what a process
    manager sends) must stop it as SIGINT does, not leave a postmaster behind."""
    import psutil

    port, log, home = free_port(), tmp_path / "serve.log", tmp_path / "home"
    proc = serve_process("--home", str(home), "--port", str(port), log=log)
    try:
        await wait_ready(f"http://127.0.0.1:{port}", proc, log, seconds=120)
        pidfile = home / "pgdata" / "postmaster.pid"
        for _ in range(300):  # written by the postmaster itself: on a loaded machine, late
            if pidfile.exists() and pidfile.read_text().split():
                break
            await asyncio.sleep(0.1)
        else:
            raise AssertionError(f"no {pidfile} after serve was ready: {log_tail(log)}")
        postmaster = int(pidfile.read_text().split()[0])
        assert psutil.pid_exists(postmaster)
        proc.send_signal(sig)
        await asyncio.to_thread(proc.wait, 60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    for _ in range(100):  # pg_ctl stop waits for the server; allow it a moment anyway
        if not psutil.pid_exists(postmaster) and not pidfile.exists():
            break
        await asyncio.sleep(0.1)
    else:
        psutil.Process(postmaster).terminate()  # leave nothing running behind the test
        raise AssertionError(f"the embedded PostgreSQL outlived serve: {log_tail(log)}")
