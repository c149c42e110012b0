"""``contextledger demo`` shows what a budget and a summary really do (issue 28): its
small budget is smaller than the view, so the request view leaves turns out, and its
summary saves a real share of the view. On both stores, through the demo's own code."""

from __future__ import annotations

import re

from rich.console import Console

from contextledger import Ledger
from contextledger.demo import run_demo


async def test_the_demo_budget_compacts_and_its_summary_saves_tokens(ledger: Ledger) -> None:
    console = Console(record=True, width=200, color_system=None)
    session = await run_demo(ledger, console)
    text = console.export_text()

    budget = int(re.search(r"request view for a (\d+)-token budget", text).group(1))  # type: ignore[union-attr]
    held, view_tokens, carried, carried_tokens = map(
        int,
        re.search(  # type: ignore[union-attr]
            r"the view holds (\d+) messages \((\d+) tokens\); this request carries (\d+) "
            r"\((\d+) tokens\)",
            text,
        ).groups(),
    )
    assert budget < view_tokens  # the budget asks the request view to leave something out
    assert carried < held and carried_tokens <= budget

    before, after, saved = map(
        int,
        re.search(r"the view went from (\d+) to (\d+) tokens \(saved (\d+)\)", text).groups(),  # type: ignore[union-attr]
    )
    assert saved == before - after and saved >= before // 5  # a summary worth having
    assert (await session.verify()).ok
