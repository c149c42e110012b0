"""Run the Alembic migrations in-process, from a wheel or from a checkout.

The migrations ship inside the wheel as ``contextledger/migrations``; in a
checkout they live at the repository's top-level ``migrations/``.
"""

from __future__ import annotations

import ast
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
    """The revision the code needs: the head of the migrations' chain.

    Read from the scripts' own ``revision`` / ``down_revision`` lines (a few ms) when
    they form one plain chain, as they do; otherwise (a merge left two heads, branch
    labels, dependencies) alembic's ScriptDirectory decides, which imports alembic and
    executes every migration module (~0.5 s, on every ``Ledger.open``: every CLI
    command paid it).
    """
    found = chain_head(migrations_dir() / "versions")
    if found is not None:
        return found
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None
    return head


_LINKS = ("revision", "down_revision", "branch_labels", "depends_on")


def chain_head(versions: Path) -> str | None:
    """The one revision no script names as its ``down_revision``, read without running
    the scripts; ``None`` when that is not plain (alembic must decide)."""
    revisions: set[str] = set()
    below: set[str] = set()
    for script in sorted(versions.glob("*.py")):
        found: dict[str, Any] = {}
        for node in ast.parse(script.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.Assign) and len(node.targets) == 1:
                target, value = node.targets[0], node.value
            elif isinstance(node, ast.AnnAssign) and node.value is not None:
                target, value = node.target, node.value
            else:
                continue
            if isinstance(target, ast.Name) and target.id in _LINKS:
                try:
                    found[target.id] = ast.literal_eval(value)
                except ValueError:
                    return None
        revision, down = found.get("revision"), found.get("down_revision")
        if not isinstance(revision, str) or found.get("branch_labels") or found.get("depends_on"):
            return None
        if not (down is None or isinstance(down, str | tuple | list)):
            return None
        revisions.add(revision)
        below.update([down] if isinstance(down, str) else down or ())
    heads = revisions - below
    return heads.pop() if len(heads) == 1 and below <= revisions else None


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
