"""Run the Alembic migrations in-process, from a wheel or from a checkout.

The migrations ship inside the wheel as ``contextledger/migrations``; in a
checkout they live at the repository's top-level ``migrations/``.
"""

from __future__ import annotations

import asyncio
import importlib
from pathlib import Path
from typing import Any

from contextledger.store.dsn import sqlalchemy_url


def migrations_dir() -> Path:
    here = Path(__file__).resolve()
    for candidate in (here.parents[1] / "migrations", here.parents[3] / "migrations"):
        if (candidate / "env.py").is_file():
            return candidate
    raise FileNotFoundError("contextledger's migrations are missing from this install")


def alembic_config(dsn: str | None = None) -> Any:
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(migrations_dir()))
    if dsn:
        cfg.set_main_option("sqlalchemy.url", sqlalchemy_url(dsn).replace("%", "%%"))
    return cfg


def head_revision() -> str:
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None
    return head


async def upgrade(dsn: str, revision: str = "head") -> None:
    """Apply migrations up to ``revision`` over one connection (no logging reset).

    Driver and server failures (down, read-only, no privilege) come out typed.
    """
    from contextledger.store.errors import translate

    try:
        await _upgrade(dsn, revision)
    except Exception as exc:
        typed = translate(exc)
        if typed is None:
            raise
        raise typed from exc


async def _upgrade(dsn: str, revision: str) -> None:
    await asyncio.to_thread(importlib.import_module, "alembic.command")  # slow imports
    await asyncio.to_thread(importlib.import_module, "sqlalchemy.ext.asyncio")
    from alembic import command
    from sqlalchemy.ext.asyncio import create_async_engine
    from sqlalchemy.pool import NullPool

    cfg = alembic_config(dsn)
    engine = create_async_engine(sqlalchemy_url(dsn), poolclass=NullPool)
    try:
        async with engine.begin() as conn:

            def run(sync_conn: Any) -> None:
                cfg.attributes["connection"] = sync_conn
                command.upgrade(cfg, revision)

            await conn.run_sync(run)
    finally:
        await engine.dispose()


def upgrade_sync(sync_connection: Any, revision: str = "head") -> None:
    """Same, over a caller's synchronous SQLAlchemy connection (test templates)."""
    from alembic import command

    cfg = alembic_config()
    cfg.attributes["connection"] = sync_connection
    command.upgrade(cfg, revision)
