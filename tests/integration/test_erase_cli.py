"""``contextledger erase``, ``erasures``, ``kek`` run as an operator runs them."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import subprocess
import sys
from pathlib import Path

from contextledger import KeyRing, Ledger

CLI = str(Path(sys.executable).with_name("contextledger"))
KEK = base64.b64encode(bytes(range(32))).decode()
NEW_KEK = base64.b64encode(bytes(range(50, 82))).decode()


def run(dsn: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("CONTEXTLEDGER_KEK")}
    full = {**base, "CONTEXTLEDGER_DSN": dsn, "COLUMNS": "200", **env}
    return subprocess.run(
        [CLI, *args], capture_output=True, text=True, env=full, timeout=120, check=False
    )


def seed(dsn: str) -> None:
    async def go() -> None:
        async with Ledger.open(dsn, keyring=KeyRing(base64.b64decode(KEK))) as ledger:
            s = await ledger.session("sealed", model="gpt-4o")
            await s.add_message({"role": "user", "content": "my card is 4111"})
            await s.add_message({"role": "assistant", "content": "noted"})
            kept = await ledger.session("kept")
            await kept.add_message({"role": "user", "content": "still here"})
        async with Ledger.open(dsn, keyring=None) as ledger:
            plain = await ledger.session("plain")
            await plain.add_message({"role": "user", "content": "in clear"})

    asyncio.run(go())


def test_erase_list_verify_and_refusals(pg_dsn: str) -> None:
    seed(pg_dsn)
    missing = run(pg_dsn, "erase", "sealed", "--yes")
    assert missing.returncode == 2 and "--reason" in missing.stderr
    plain = run(pg_dsn, "erase", "plain", "--reason", "asked", "--yes")
    assert plain.returncode == 2
    assert "[SESSION_NOT_ENCRYPTED]" in plain.stderr and "purge" in plain.stderr
    erased = run(
        pg_dsn, "erase", "sealed", "--reason", "user asked", "--actor", "ticket-7", "--yes"
    )  # no KEK needed to destroy a key
    assert erased.returncode == 0, erased.stderr
    assert "erased sealed: 3 events" in erased.stdout
    listed = json.loads(run(pg_dsn, "erasures", "--json").stdout)
    assert [(r["session_id"], r["reason"], r["actor"]) for r in listed] == [
        ("sealed", "user asked", "ticket-7")
    ]
    verified = run(pg_dsn, "verify", "sealed")
    assert verified.returncode == 0 and "3 events" in verified.stdout
    view = run(pg_dsn, "view", "sealed", "--json", CONTEXTLEDGER_KEK=KEK)
    assert view.returncode == 2 and "[SESSION_ERASED]" in view.stderr
    again = run(pg_dsn, "erase", "sealed", "--reason", "again", "--yes")
    assert again.returncode == 2 and "[SESSION_ERASED]" in again.stderr
    kept = run(pg_dsn, "view", "kept", "--json", CONTEXTLEDGER_KEK=KEK)
    assert json.loads(kept.stdout) == [{"role": "user", "content": "still here"}]


def test_kek_generate_and_rotate(pg_dsn: str) -> None:
    seed(pg_dsn)
    made = run(pg_dsn, "kek", "generate")
    assert made.returncode == 0 and len(base64.b64decode(made.stdout.strip())) == 32
    no_old = run(pg_dsn, "kek", "rotate", CONTEXTLEDGER_KEK=NEW_KEK)
    assert no_old.returncode == 2 and "[KEY_UNAVAILABLE]" in no_old.stderr
    rotated = run(pg_dsn, "kek", "rotate", CONTEXTLEDGER_KEK=NEW_KEK, CONTEXTLEDGER_KEK_OLD=KEK)
    assert rotated.returncode == 0, rotated.stderr
    assert "re-wrapped 2 data keys" in rotated.stdout
    view = run(pg_dsn, "view", "kept", "--json", CONTEXTLEDGER_KEK=NEW_KEK)
    assert json.loads(view.stdout) == [{"role": "user", "content": "still here"}]
    old = run(pg_dsn, "view", "kept", "--json", CONTEXTLEDGER_KEK=KEK)
    assert old.returncode == 2 and "[KEY_UNAVAILABLE]" in old.stderr
