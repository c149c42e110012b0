"""The ``contextledger`` command, run as a person runs it: a real process on a real server."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import asyncpg

from contextledger import Ledger
from contextledger.store.dsn import asyncpg_dsn

CLI = str(Path(sys.executable).with_name("contextledger"))


def run(
    dsn: str, *args: str, input: str | None = None, columns: int = 200
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CONTEXTLEDGER_DSN": dsn, "COLUMNS": str(columns)}
    return subprocess.run(
        [CLI, *args], capture_output=True, text=True, env=env, input=input, timeout=120, check=False
    )


def seed(dsn: str) -> None:
    async def go() -> None:
        async with Ledger.open(dsn) as ledger:
            session = await ledger.session("cli", model="gpt-4o")
            await session.add_message({"role": "user", "content": "first question"})
            await session.add_message({"role": "assistant", "content": "first answer"})
            await session.checkpoint("mid")
            await session.add_message({"role": "user", "content": "second question"})

    asyncio.run(go())


def test_sessions_events_and_view(pg_dsn: str) -> None:
    seed(pg_dsn)
    listed = run(pg_dsn, "sessions")
    assert listed.returncode == 0, listed.stderr
    assert "cli" in listed.stdout and "gpt-4o" in listed.stdout
    events = run(pg_dsn, "events", "cli", "--json")
    assert events.returncode == 0, events.stderr
    rows = [json.loads(line) for line in events.stdout.splitlines()]
    assert [r["seq"] for r in rows] == [1, 2, 3, 4, 5]
    assert [r["type"] for r in rows][3] == "checkpoint.created"
    view = run(pg_dsn, "view", "cli", "--json")
    assert [m["content"] for m in json.loads(view.stdout)] == [
        "first question",
        "first answer",
        "second question",
    ]
    at = run(pg_dsn, "view", "cli", "--at", "3", "--json")
    assert [m["content"] for m in json.loads(at.stdout)] == ["first question", "first answer"]


def test_checkpoint_rollback_verify_rebuild(pg_dsn: str) -> None:
    seed(pg_dsn)
    assert run(pg_dsn, "checkpoint", "cli", "later").returncode == 0
    rolled = run(pg_dsn, "rollback", "cli", "mid")
    assert rolled.returncode == 0, rolled.stderr
    view = run(pg_dsn, "view", "cli", "--json")
    assert [m["content"] for m in json.loads(view.stdout)] == ["first question", "first answer"]
    assert run(pg_dsn, "rollback", "cli", "5").returncode == 0
    assert len(json.loads(run(pg_dsn, "view", "cli", "--json").stdout)) == 3
    ok = run(pg_dsn, "verify", "--all")
    assert ok.returncode == 0 and "ok" in ok.stdout
    rebuilt = run(pg_dsn, "rebuild")
    assert rebuilt.returncode == 0 and "ok" in rebuilt.stdout


def test_verify_exits_1_on_a_tampered_chain(pg_dsn: str) -> None:
    seed(pg_dsn)

    async def tamper() -> None:
        conn = await asyncpg.connect(asyncpg_dsn(pg_dsn))
        try:
            async with conn.transaction():
                await conn.execute("ALTER TABLE contextledger.events DISABLE TRIGGER USER")
                await conn.execute(
                    "UPDATE contextledger.events SET tokens = tokens + 1"
                    " WHERE session_id = 'cli' AND seq = 2"
                )
                await conn.execute("ALTER TABLE contextledger.events ENABLE TRIGGER USER")
        finally:
            await conn.close()

    asyncio.run(tamper())
    bad = run(pg_dsn, "verify", "cli")
    assert bad.returncode == 1
    assert "BAD" in bad.stdout and "seq 2" in bad.stdout


def test_errors_print_their_code_and_exit_2(pg_dsn: str) -> None:
    seed(pg_dsn)
    missing = run(pg_dsn, "view", "nobody")
    assert missing.returncode == 2 and "[SESSION_NOT_FOUND]" in missing.stderr
    no_cp = run(pg_dsn, "rollback", "cli", "no-such-label")
    assert no_cp.returncode == 2 and "[CHECKPOINT_NOT_FOUND]" in no_cp.stderr
    out_of_range = run(pg_dsn, "view", "cli", "--at", "0")
    assert out_of_range.returncode == 2 and "[INVALID_ARGUMENT]" in out_of_range.stderr
    usage = run(pg_dsn, "verify")
    assert usage.returncode == 2 and "SESSION_ID or --all" in usage.stderr
    bad_dsn = run("mysql://nope", "sessions")
    assert bad_dsn.returncode == 2 and "[INVALID_ARGUMENT]" in bad_dsn.stderr


def test_migrate_then_purge_with_an_audit_row(pg_dsn: str, postgresql: Any) -> None:
    postgresql.autocommit = True
    postgresql.execute("CREATE DATABASE cl_cli_fresh")
    fresh = pg_dsn.replace(f"/{postgresql.info.dbname}?", "/cl_cli_fresh?")
    try:
        unmigrated = run(fresh, "sessions")
        assert unmigrated.returncode == 2 and "[MIGRATION_REQUIRED]" in unmigrated.stderr
        migrated = run(fresh, "migrate")
        assert migrated.returncode == 0, migrated.stderr
        assert run(fresh, "sessions").returncode == 0
    finally:
        postgresql.execute("DROP DATABASE cl_cli_fresh WITH (FORCE)")
    seed(pg_dsn)
    blank = run(pg_dsn, "purge", "cli", "--reason", " ", "--yes")
    assert blank.returncode == 2 and "[INVALID_ARGUMENT]" in blank.stderr
    purged = run(pg_dsn, "purge", "cli", "--reason", "user asked", "--yes")
    assert purged.returncode == 0, purged.stderr
    assert "5 events" in purged.stdout
    assert "cli" not in run(pg_dsn, "sessions").stdout


def _cells(out: str, first: str) -> list[list[str]]:
    """The cells of a rich table's body rows whose first cell is ``first``-like (digits)."""
    rows = []
    for line in out.splitlines():
        cells = [c.strip() for c in line.strip("│┃ ").split("│")]
        if cells and (cells[0] == first or (first == "digits" and cells[0].isdigit())):
            rows.append(cells)
    return rows


def test_tables_keep_seq_role_and_tokens_whole_at_80_columns(pg_dsn: str) -> None:
    seed(pg_dsn)
    events = run(pg_dsn, "events", "cli", columns=80)
    assert events.returncode == 0, events.stderr
    assert max(len(line) for line in events.stdout.splitlines()) <= 80
    rows = _cells(events.stdout, "digits")
    assert [r[0] for r in rows] == ["1", "2", "3", "4", "5"]
    assert [r[2] for r in rows] == ["", "user", "assistant", "", "user"]
    assert all(r[3].isdigit() for r in rows)  # tokens, whole
    header = next(line for line in events.stdout.splitlines() if "seq" in line)
    assert "tokens" in header and "role" in header
    listed = run(pg_dsn, "sessions", columns=80)
    [row] = _cells(listed.stdout, "cli")
    assert row[3:] == ["5", row[4], row[5]] and row[4].isdigit() and row[5] == "3"
    view = run(pg_dsn, "view", "cli", columns=80)
    assert [r[1] for r in _cells(view.stdout, "digits")] == ["user", "assistant", "user"]


def test_every_command_takes_dsn_home_and_tenant_after_its_name(pg_dsn: str) -> None:
    """``anchor ID --dsn …`` was "No such option" while ``checkpoints ID --dsn …`` worked."""
    seed(pg_dsn)
    pinned = subprocess.run(
        [CLI, "anchor", "cli", "--dsn", pg_dsn],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={k: v for k, v in os.environ.items() if k != "CONTEXTLEDGER_DSN"},
    )
    assert pinned.returncode == 0, pinned.stderr
    assert json.loads(pinned.stdout)["seq"] == 5
