"""The service on a real loopback port, inside the test's own event loop."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import openai
import uvicorn
from fastapi import FastAPI
from openai import AsyncOpenAI

from contextledger import Ledger
from contextledger.http.app import create_app
from contextledger.http.keys import create_key
from contextledger.http.protocol import OneWriteHttp
from contextledger.http.settings import Settings
from contextledger.store.dsn import asyncpg_dsn
from tests.fakellm import FakeLLM


@dataclass
class Running:
    url: str
    app: FastAPI
    client: httpx.AsyncClient
    server: uvicorn.Server


def _server(settings: Settings) -> tuple[FastAPI, uvicorn.Server]:
    """The service's app on a uvicorn server on a free loopback port, not started."""
    app = create_app(settings)
    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=0,
        log_config=None,
        access_log=False,
        lifespan="on",
        http=OneWriteHttp,  # as ``contextledger serve`` runs it
    )
    return app, uvicorn.Server(config)


@asynccontextmanager
async def running_service(settings: Settings) -> AsyncIterator[Running]:
    app, server = _server(settings)
    task = asyncio.create_task(server.serve())
    while not server.started:
        if task.done():
            task.result()
            raise RuntimeError("the service stopped before it started")
        await asyncio.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    try:
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            yield Running(url, app, client, server)
    finally:
        server.should_exit = True
        await task


async def new_key(dsn: str, tenant: str) -> str:
    conn = await asyncpg.connect(asyncpg_dsn(dsn))
    try:
        return (await create_key(conn, tenant))[1]
    finally:
        await conn.close()


@contextmanager
def service_in_thread(settings: Settings) -> Iterator[str]:
    """The service on its own thread and loop, for synchronous clients (schemathesis)."""
    _, server = _server(settings)
    server.install_signal_handlers = lambda: None  # type: ignore[method-assign]
    thread = threading.Thread(target=lambda: asyncio.run(server.serve()), daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the service did not start")
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)


def client(svc: Running, session: str) -> AsyncOpenAI:
    """The real ``openai`` SDK pointed at the service's proxy, naming ``session``."""
    return AsyncOpenAI(
        base_url=f"{svc.url}/v1",
        api_key="unused-in-local-mode",
        default_headers={"X-Session-Id": session},
        max_retries=0,
    )


async def branch(svc: Running, dsn: str, session_id: str) -> list[dict[str, Any]]:
    """The session's branch as another process reads it, once the replies the service
    records after responding have landed."""
    await svc.app.state.tenants.settled()
    async with Ledger.open(dsn) as ledger:
        return await (await ledger.session(session_id, create=False)).get_messages()


@asynccontextmanager
async def proxy_service(
    dsn: str, fake: FakeLLM, relay: bool, **overrides: Any
) -> AsyncIterator[Running]:
    """The service proxying to ``fake`` with a key of its own, relayed or through litellm."""
    settings = Settings(
        dsn=dsn,
        migrate=False,
        upstream_api_base=fake.base_url,
        upstream_api_key="upstream-secret",
        upstream_relay=relay,
        **overrides,
    )
    async with running_service(settings) as running:
        yield running


async def reply_text(response: Any) -> str:
    """The answer's text, streamed (``AsyncStream``) or not."""
    if isinstance(response, openai.AsyncStream):
        return "".join([c.choices[0].delta.content or "" async for c in response if c.choices])
    return str(response.choices[0].message.content or "")


def metric(text: str, sample: str) -> float | None:
    """The value of the ``/metrics`` sample (name and labels: ``sample``) in ``text``; None
    when there is no such line."""
    for line in text.splitlines():
        if line.rpartition(" ")[0] == sample:
            return float(line.rpartition(" ")[2])
    return None


async def until(check: Callable[[], Awaitable[bool]], what: str) -> None:
    """Poll ``check`` until it holds (a synchronization point, not a timing assertion)."""
    for _ in range(1000):
        if await check():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"never happened: {what}")


@asynccontextmanager
async def inserts_held(dsn: str) -> AsyncIterator[asyncpg.Connection]:
    """No event can be written while this is open (reads go on): a write waits for it."""
    conn = await asyncpg.connect(asyncpg_dsn(dsn))
    try:
        async with conn.transaction():
            await conn.execute("LOCK TABLE contextledger.events IN SHARE MODE")
            yield conn
    finally:
        await conn.close()


async def writes_waiting(conn: asyncpg.Connection) -> int:
    """How many writes of events wait for ``inserts_held``."""
    return int(
        await conn.fetchval(
            "SELECT count(*) FROM pg_locks WHERE NOT granted"
            " AND relation = 'contextledger.events'::regclass"
        )
    )


@asynccontextmanager
async def appends_held(
    dsn: str, start: Callable[[], list[asyncio.Task[httpx.Response]]]
) -> AsyncIterator[list[asyncio.Task[httpx.Response]]]:
    """The requests ``start`` sends, held in flight: their appends wait in the database
    until the block ends (for shutdown tests: the service must finish them)."""
    async with inserts_held(dsn) as held:
        sent = start()

        async def waiting() -> bool:
            return await writes_waiting(held) >= 1

        await until(waiting, "an append waits in the database")
        await asyncio.sleep(0.3)  # the others reach the service and queue behind it
        yield sent


# -- ``contextledger serve`` as a process of its own ----------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serve_process(*args: str, log: Path) -> subprocess.Popen[bytes]:
    """``contextledger serve ARGS`` with none of this process's CONTEXTLEDGER_ settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONTEXTLEDGER_")}
    return subprocess.Popen(
        [sys.executable, "-m", "contextledger.cli", "serve", *args],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=log.open("wb"),
    )


def log_tail(log: Path, n: int = 3000) -> str:
    return log.read_text()[-n:]


async def wait_ready(
    url: str, proc: subprocess.Popen[bytes], log: Path, *, seconds: float = 30
) -> None:
    """Until ``url``/readyz answers 200; an AssertionError with the log's tail if the
    process exits or ``seconds`` pass."""
    async with httpx.AsyncClient() as c:
        for _ in range(int(seconds / 0.05)):
            if proc.poll() is not None:
                raise AssertionError(f"serve exited {proc.returncode}: {log_tail(log)}")
            try:
                if (await c.get(url + "/readyz")).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            await asyncio.sleep(0.05)
    raise AssertionError(f"serve did not get ready: {log_tail(log)}")
