"""The audit page in a real browser (Debian chromium, headless, driven by playwright)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest_asyncio
from playwright.async_api import Browser, async_playwright

from contextledger import Ledger
from contextledger.http.settings import Settings
from tests.integration.browser import ensure_chromium
from tests.integration.service_support import Running, new_key, running_service


@pytest_asyncio.fixture
async def browser() -> AsyncIterator[Browser]:
    path = ensure_chromium()
    async with async_playwright() as p:
        b = await p.chromium.launch(executable_path=path, args=["--no-sandbox"])
        try:
            yield b
        finally:
            await b.close()


async def _story(dsn: str) -> list[list[dict[str, Any]]]:
    """A session with messages, a checkpoint, a rolled-back branch and a compaction;
    returns request_at(seq) for every seq, as the library replays it."""
    async with Ledger.open(dsn) as ledger:
        s = await ledger.session("story", model="gpt-4o")
        await s.add_message({"role": "system", "content": "You are a careful assistant."})
        await s.add_message({"role": "user", "content": "Plan a trip to Oslo."})
        await s.add_message({"role": "assistant", "content": "Day 1: the fjord."})
        await s.checkpoint("plan-v1")
        await s.add_message({"role": "user", "content": "Actually, go to Rome instead."})
        await s.rollback("plan-v1")
        await s.add_message({"role": "user", "content": "Add a museum on day 2."})
        for i in range(4):
            await s.add_message({"role": "assistant", "content": f"Museum option {i}. " * 15})
        await s.compact("truncate", token_budget=120)
        return [await s.request_at(seq) for seq in range(1, s.head + 1)]


async def test_timeline_branches_verify_badge_and_seq_picker(pg_dsn: str, browser: Browser) -> None:
    seen = await _story(pg_dsn)
    async with running_service(Settings(dsn=pg_dsn, migrate=False)) as svc:
        await _check_page(svc, browser, seen)


async def _check_page(svc: Running, browser: Browser, seen: list[list[dict[str, Any]]]) -> None:
    page = await browser.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    await page.goto(svc.url + "/")
    await page.click("#sessions a:text('story')")
    await page.wait_for_selector("#timeline")
    assert "chain verified" in await page.inner_text("#verify")
    types = await page.eval_on_selector_all(
        "#timeline li .type", "els => els.map(e => e.textContent)"
    )
    assert "session.rolled_back" in types and "compaction.applied" in types
    side = await page.eval_on_selector_all(
        "#timeline li.side", "els => els.map(e => e.dataset.seq)"
    )
    assert side == ["6"]  # "go to Rome" was rolled back: drawn on a side branch
    assert "Rome" in await page.inner_text("#timeline li.side")
    for seq in (3, 6, 9, len(seen)):
        await page.select_option("#seq", str(seq))
        await page.wait_for_selector(f"#request[data-at='{seq}']")
        shown = await page.eval_on_selector_all(
            "#request li", "els => els.map(e => e.querySelector('b').textContent)"
        )
        assert shown == [m["role"] for m in seen[seq - 1]], seq
        text = " ".join((await page.inner_text("#request")).split())  # as HTML lays it out
        assert all(" ".join(str(m["content"]).split())[:20] in text for m in seen[seq - 1])
        # what the model saw right after seq 6 included the branch later rolled back
        assert ("Rome" in text) == (seq == 6)
    assert errors == []


async def test_with_keys_the_page_asks_for_one_and_shows_that_tenants_sessions(
    pg_dsn: str, browser: Browser
) -> None:
    async with Ledger.open(pg_dsn, tenant="acme", role="contextledger_service") as ledger:
        await (await ledger.session("acme-work")).add_message({"role": "user", "content": "hi"})
    async with Ledger.open(pg_dsn, tenant="other", role="contextledger_service") as ledger:
        await (await ledger.session("other-secret")).add_message({"role": "user", "content": "x"})
    key = await new_key(pg_dsn, "acme")
    settings = Settings(dsn=pg_dsn, migrate=False, key_cache_seconds=0)
    async with running_service(settings) as svc:
        page = await browser.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        first = await page.goto(svc.url + "/audit/sessions/acme-work")
        assert first is not None and first.status == 401
        await page.fill("#signin input[name=key]", key + "x")
        await page.click("#signin button")
        assert "not valid" in await page.inner_text("#error")
        await page.fill("#signin input[name=key]", key)
        await page.click("#signin button")
        await page.wait_for_selector("#timeline")  # back where it was going, signed in
        assert "chain verified" in await page.inner_text("#verify")
        cookies = {c["name"]: c for c in await page.context.cookies()}
        assert cookies["cl_key"]["httpOnly"] and cookies["cl_key"]["sameSite"] == "Strict"
        assert await page.evaluate("document.cookie") == ""  # no script can read the key
        await page.goto(svc.url + "/")
        listed = await page.eval_on_selector_all("#sessions a", "els => els.map(e => e.text)")
        assert listed == ["acme-work"]  # not the other tenant's session
        await page.click("#signout button")
        await page.wait_for_selector("#signin")
        assert errors == []
