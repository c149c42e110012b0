"""``contextledger keys create|list|revoke`` against a real database (in a subprocess,
as test_cli does: the CLI configures logging for its whole process)."""

from __future__ import annotations

import asyncio
import re

from contextledger import Ledger
from tests.integration.test_cli import run

ROLE = "contextledger_service"


def test_create_list_revoke(pg_dsn: str) -> None:
    created = run(pg_dsn, "keys", "create", "acme", "--name", "ci")
    assert created.returncode == 0, created.stderr
    match = re.search(r"^cl_([0-9a-f]{12})_\S+$", created.stdout, re.M)
    assert match is not None
    key_id = match.group(1)
    listed = run(pg_dsn, "keys", "list")
    assert key_id in listed.stdout and "acme" in listed.stdout
    assert match.group(0) not in listed.stdout  # the key itself is never shown again
    assert run(pg_dsn, "keys", "revoke", key_id).returncode == 0
    assert run(pg_dsn, "keys", "revoke", key_id).returncode == 2
    bad = run(pg_dsn, "keys", "create", "no spaces allowed")
    assert bad.returncode == 2 and "INVALID_ARGUMENT" in bad.stderr


def test_the_cli_acts_as_one_tenant(pg_dsn: str) -> None:
    async def seed() -> None:
        for tenant in ("acme", "other"):
            async with Ledger.open(pg_dsn, tenant=tenant, role=ROLE) as ledger:
                s = await ledger.session("shared-id")
                await s.add_message({"role": "user", "content": f"said in {tenant}"})

    asyncio.run(seed())
    acme = run(pg_dsn, "--tenant", "acme", "view", "shared-id")
    assert acme.returncode == 0, acme.stderr
    assert "said in acme" in acme.stdout and "said in other" not in acme.stdout
    assert run(pg_dsn, "--tenant", "nobody", "view", "shared-id").returncode == 2
