"""A wheel install must be able to migrate: the migrations ship inside the package."""

from __future__ import annotations

import asyncio
import os
import sys
import textwrap
import zipfile
from pathlib import Path
from typing import Any

import asyncpg

from contextledger.store.dsn import asyncpg_dsn

ROOT = Path(__file__).resolve().parents[2]


async def test_the_built_wheel_migrates_a_database_by_itself(
    tmp_path: Path, pg_dsn: str, postgresql: Any
) -> None:
    build = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "--no-deps",
        "--no-build-isolation",
        "-q",
        "-w",
        str(tmp_path / "dist"),
        str(ROOT),
    )
    assert await build.wait() == 0
    [wheel] = list((tmp_path / "dist").glob("contextledger_pg-*.whl"))
    target = tmp_path / "site"
    with zipfile.ZipFile(wheel) as zf:  # a pure-Python wheel installs by unpacking
        names = zf.namelist()
        zf.extractall(target)
    assert "contextledger/migrations/env.py" in names
    assert any(n.startswith("contextledger/migrations/versions/0001") for n in names)

    # a database nobody migrated yet
    conn = await asyncpg.connect(asyncpg_dsn(pg_dsn))
    try:
        await conn.execute("CREATE DATABASE cl_wheel")
    finally:
        await conn.close()
    dsn = pg_dsn.replace(f"/{postgresql.info.dbname}?", "/cl_wheel?")
    script = textwrap.dedent(f"""
        import asyncio, contextledger
        from contextledger.store.migrate import migrations_dir, upgrade
        assert contextledger.__file__.startswith({str(target)!r}), contextledger.__file__
        assert str(migrations_dir()).startswith({str(target)!r}), migrations_dir()
        asyncio.run(upgrade({dsn!r}))
        print("migrated from", migrations_dir())
    """)
    env = {**os.environ, "PYTHONPATH": str(target)}
    run = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        script,
        env=env,
        cwd=str(tmp_path),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await run.communicate()
    try:
        assert run.returncode == 0, err.decode()
        assert b"migrated from" in out
        conn = await asyncpg.connect(asyncpg_dsn(dsn))
        try:
            revision = await conn.fetchval("SELECT version_num FROM contextledger.alembic_version")
        finally:
            await conn.close()
        from contextledger.store.migrate import head_revision

        assert revision == head_revision()
    finally:
        conn = await asyncpg.connect(asyncpg_dsn(pg_dsn))
        try:
            await conn.execute("DROP DATABASE cl_wheel WITH (FORCE)")
        finally:
            await conn.close()
