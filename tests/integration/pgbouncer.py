"""Debian's PgBouncer for the pooler tests, installed when missing (as browser.py
installs chromium), started in transaction mode on a loopback port in front of the
test PostgreSQL. Where it cannot be installed the test fails loudly (never skips)."""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.integration.debian import ensure_package
from tests.integration.service_support import free_port

PGBOUNCER = Path("/usr/sbin/pgbouncer")
#: PgBouncer will not run as root: it drops to the server's own user (its socket), or to
#: this one (Debian's package runs as it).
RUN_AS = "postgres"


def ensure_pgbouncer() -> str:
    return ensure_package(PGBOUNCER, "pgbouncer")


@dataclass(frozen=True)
class Bouncer:
    port: int
    log: Path

    def dsn(self, user: str, dbname: str) -> str:
        return f"postgresql://{user}@127.0.0.1:{self.port}/{dbname}"

    def stats(self, user: str) -> dict[str, int]:
        """PgBouncer's own totals (``SHOW STATS``, every database but its console summed;
        ``user`` is the first of ``running_pgbouncer``'s, the one its console admits):
        transactions, queries (each ``Sync`` or simple query: a round trip to the
        server), bytes, microseconds."""
        import psycopg

        with psycopg.connect(self.dsn(user, "pgbouncer"), autocommit=True) as conn:
            cur = conn.execute("SHOW STATS")  # no parameters: the simple protocol it takes
            names = [d.name for d in cur.description or ()]
            totals: dict[str, int] = {}
            for row in cur.fetchall():
                if row[names.index("database")] == "pgbouncer":
                    continue  # its console: these SHOW STATS
                for name, value in zip(names, row, strict=True):
                    if name.startswith("total_"):
                        totals[name[6:]] = totals.get(name[6:], 0) + int(value)
            return totals


@contextmanager
def running_pgbouncer(
    pg_host: str, pg_port: int, users: list[str], *, pool_size: int = 3
) -> Iterator[Bouncer]:
    """PgBouncer in transaction mode in front of ``pg_host:pg_port`` (a host or a socket
    directory), trusting ``users``; few server connections per user and database, so
    clients share them transaction by transaction."""
    binary = ensure_pgbouncer()
    home = Path(tempfile.mkdtemp(prefix="cl-pgbouncer-"))
    port = free_port()
    (home / "users.txt").write_text("".join(f'"{u}" ""\n' for u in users))
    (home / "pgbouncer.ini").write_text(
        "[databases]\n"
        f"* = host={pg_host} port={pg_port}\n"
        "[pgbouncer]\n"
        "listen_addr = 127.0.0.1\n"
        f"listen_port = {port}\n"
        "unix_socket_dir =\n"
        "auth_type = trust\n"
        f"stats_users = {users[0]}\n"  # SHOW STATS on its console (bench/service.py)
        f"auth_file = {home / 'users.txt'}\n"
        "pool_mode = transaction\n"
        f"default_pool_size = {pool_size}\n"
        "max_client_conn = 500\n"
        "server_reset_query =\n"
        f"logfile = {home / 'pgbouncer.log'}\n"
        f"pidfile = {home / 'pgbouncer.pid'}\n"
    )
    runner = None
    if os.geteuid() == 0:
        sock = Path(pg_host) / f".s.PGSQL.{pg_port}"
        # the server's own user can reach its socket directory; over TCP, Debian's user
        runner = pwd.getpwuid(sock.stat().st_uid) if sock.exists() else pwd.getpwnam(RUN_AS)
    if runner is not None:
        for path in (home, *home.iterdir()):
            os.chown(path, runner.pw_uid, runner.pw_gid)
    cmd = [binary, *(["-u", runner.pw_name] if runner else []), str(home / "pgbouncer.ini")]
    # It logs every line to stderr as well as to its log file: to a file, never a pipe
    # nobody reads (full at 64 kB, it blocked there: a long benchmark hung on it).
    errors = home / "stderr.txt"
    with errors.open("wb") as err_out:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err_out)
    log = home / "pgbouncer.log"
    try:
        deadline = time.monotonic() + 20
        while True:
            if proc.poll() is not None:
                err = errors.read_text(errors="replace")[-2000:]
                tail = log.read_text()[-2000:] if log.exists() else ""
                pytest.fail(f"pgbouncer exited {proc.returncode}: {err}{tail}")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail("pgbouncer did not listen")
                time.sleep(0.05)
        yield Bouncer(port, log)
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(home, ignore_errors=True)
