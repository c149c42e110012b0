"""Helpers of the fault suite: DSNs on its throwaway server, admin SQL."""

from __future__ import annotations

from typing import Any

import asyncpg

from contextledger.store.dsn import asyncpg_dsn


def server_dsn(srv: Any, db: str = "postgres") -> str:
    info = srv.get_postmaster_info()
    return f"postgresql://postgres@/{db}?host={info.socket_dir}&port={info.port}"


async def admin(dsn: str, *sql: str) -> None:
    conn = await asyncpg.connect(asyncpg_dsn(dsn))
    try:
        for statement in sql:
            await conn.execute(statement)
    finally:
        await conn.close()
