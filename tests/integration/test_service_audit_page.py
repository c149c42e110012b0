"""The audit page's HTML for summaries, over real HTTP against a real PostgreSQL: the
summary a session recorded (its text, not "null"), readable (headings and bullets on lines
of their own) and escaped (a model wrote it: nothing in it becomes markup)."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator

import pytest_asyncio

from contextledger import Ledger
from contextledger.http.settings import Settings
from tests.integration.service_support import Running, running_service

SUMMARY = (
    "## Task overview\n- port is 8443, not 8080\n- decision: read it from config\n"
    "Open: <script>alert(1)</script> & a test"
)


@pytest_asyncio.fixture
async def svc(pg_dsn: str) -> AsyncIterator[Running]:
    async with running_service(Settings(dsn=pg_dsn, migrate=False)) as running:
        yield running


async def test_a_summary_shows_its_text_readably_and_escaped(svc: Running, pg_dsn: str) -> None:
    async with Ledger.open(pg_dsn) as ledger:
        session = await ledger.session("audit-summary", model="gpt-4o")
        for n in range(6):
            await session.add_message({"role": "user", "content": f"turn {n} about the port"})
        seq = await session.record_summary(2, 5, SUMMARY)

    page = (await svc.client.get("/audit/sessions/audit-summary")).text
    [line] = re.findall(rf'<li[^>]*data-seq="{seq}".*?</li>', page, re.S)
    assert "null" not in line
    assert "summary of seq 2-5" in line
    assert "<p class=h>Task overview</p>" in line
    assert "<p class=bullet>port is 8443, not 8080</p>" in line
    assert "<p class=bullet>decision: read it from config</p>" in line
    assert "&lt;script&gt;alert(1)&lt;/script&gt; &amp; a test" in line
    assert "<script>alert" not in page
    # what the model saw keeps the summary's line breaks (shown pre-wrapped), escaped too
    assert "## Task overview\n- port is 8443" in page
