"""Debian's PgBouncer for the pooler tests, installed when missing (as browser.py
installs chromium), started in transaction mode on a loopback port in front of the
test PostgreSQL. Where it cannot be installed the test fails loudly (never skips)."""

from __future__ import annotations

import fcntl
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

PGBOUNCER = Path("/usr/sbin/pgbouncer")
#: PgBouncer will not run as root: it drops to the server's own user (its socket), or to
#: this one (Debian's package runs as it).
RUN_AS = "postgres"


def ensure_pgbouncer() -> str:
    if PGBOUNCER.is_file():
        return str(PGBOUNCER)
    apt = shutil.which("apt-get")
    if apt is None or os.geteuid() != 0:
        pytest.fail(
            "the pooler test needs Debian's pgbouncer at /usr/sbin/pgbouncer; install it with "
            "`apt-get install -y pgbouncer` (this machine has no apt-get or we are not root)"
        )
    with open("/tmp/contextledger-pgbouncer.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # parallel suites: one apt at a time
        if not PGBOUNCER.is_file():
            env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
            wait = ["-o", "DPkg::Lock::Timeout=600"]  # another apt/dpkg may hold the lock
            for cmd in (
                [apt, *wait, "update", "-qq"],
                [apt, *wait, "install", "-y", "-qq", "pgbouncer"],
            ):
                done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
                if done.returncode != 0:
                    pytest.fail(f"{' '.join(cmd)} failed:\n{done.stderr[-2000:]}")
    if not PGBOUNCER.is_file():
        pytest.fail("apt installed pgbouncer but /usr/sbin/pgbouncer is missing")
    return str(PGBOUNCER)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class Bouncer:
    port: int
    log: Path

    def dsn(self, user: str, dbname: str) -> str:
        return f"postgresql://{user}@127.0.0.1:{self.port}/{dbname}"


@contextmanager
def running_pgbouncer(
    pg_host: str, pg_port: int, users: list[str], *, pool_size: int = 3
) -> Iterator[Bouncer]:
    """PgBouncer in transaction mode in front of ``pg_host:pg_port`` (a host or a socket
    directory), trusting ``users``; few server connections per user and database, so
    clients share them transaction by transaction."""
    binary = ensure_pgbouncer()
    home = Path(tempfile.mkdtemp(prefix="cl-pgbouncer-"))
    port = _free_port()
    (home / "users.txt").write_text("".join(f'"{u}" ""\n' for u in users))
    (home / "pgbouncer.ini").write_text(
        "[databases]\n"
        f"* = host={pg_host} port={pg_port}\n"
        "[pgbouncer]\n"
        "listen_addr = 127.0.0.1\n"
        f"listen_port = {port}\n"
        "unix_socket_dir =\n"
        "auth_type = trust\n"
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
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    log = home / "pgbouncer.log"
    try:
        deadline = time.monotonic() + 20
        while True:
            if proc.poll() is not None:
                err = proc.stderr.read().decode() if proc.stderr else ""
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
