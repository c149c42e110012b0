"""The store contract (``test_store_contract.py``) again, through Debian's PgBouncer in
transaction mode with two server connections, on a tenant's connections
(``pgbouncer=True``): every lone statement with its scope in front of it, each
transaction scoped at its ``BEGIN`` (``store/scoped.py``, ``store/pipelined.py``)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import asyncpg
import pytest_asyncio

from contextledger import Ledger
from contextledger.store.dsn import asyncpg_dsn
from tests.integration.conftest import PG_HOST, PG_PORT
from tests.integration.pgbouncer import running_pgbouncer
from tests.integration.service_support import new_key
from tests.integration.test_store_contract import *  # noqa: F403  (the same tests, here)

ROLE = "contextledger_service"


@pytest_asyncio.fixture
async def ledger(pg_dsn: str) -> AsyncIterator[Ledger]:
    """Overrides conftest's: the tenant ``alpha`` (keys exist: an unscoped statement
    would read and write nothing) through PgBouncer."""
    await new_key(pg_dsn, "alpha")
    conn = await asyncpg.connect(asyncpg_dsn(pg_dsn))
    try:
        user, dbname = await conn.fetchrow("SELECT current_user, current_database()")
    finally:
        await conn.close()
    with running_pgbouncer(PG_HOST, PG_PORT, [user, ROLE], pool_size=2) as bouncer:
        async with Ledger.open(
            bouncer.dsn(ROLE, dbname), migrate=False, tenant="alpha", pgbouncer=True
        ) as opened:
            yield opened
