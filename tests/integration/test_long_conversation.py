"""500 turns on a real PostgreSQL with auto-compaction by rolling summaries.

The summarizer is the fake server's default handler (a short deterministic
summary), reached through litellm over HTTP. Every turn asks
``get_messages_for_request`` for a small budget, as an agent loop would.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator
from typing import Any

import pytest

from contextledger import Ledger
from contextledger.core.compaction.request import thresholds
from contextledger.recall import reserve_for
from contextledger.session import Session
from tests.fakellm import FakeLLM, running_fake_llm, summary_answer

TURNS = 500
BUDGET = 3000
WORDS = (
    "ledger",
    "postgres",
    "index",
    "migration",
    "replica",
    "vacuum",
    "schema",
    "query",
    "latency",
    "rollback",
    "checkpoint",
    "summary",
    "token",
    "budget",
    "cache",
)


@pytest.fixture(name="fake_llm")
def _fake_llm() -> Iterator[FakeLLM]:
    """``tests.fakellm.fake_llm`` (a fresh scripted server), bound locally."""
    with running_fake_llm() as fake:
        yield fake


def _text(rng: random.Random, prefix: str, low: int, high: int) -> str:
    return prefix + " " + " ".join(rng.choice(WORDS) for _ in range(rng.randint(low, high)))


def _tokens(session: Session, messages: list[dict[str, Any]]) -> int:
    return sum(session.counter.count_message(m) for m in messages)


async def test_500_turns_stay_in_budget_with_rolling_summaries(
    pg_ledger: Ledger, fake_llm: FakeLLM
) -> None:
    fake_llm.set_default(summary_answer)
    session = await pg_ledger.session(
        "long",
        config={
            "auto_compact": True,
            "compaction_strategy": "summarize",
            "token_counter": "chars",
            "summarizer": {
                "models": [
                    {
                        "model": "openai/summarizer",
                        "api_base": fake_llm.base_url,
                        "api_key": "test",
                        "timeout": 5.0,
                        "num_retries": 0,
                    }
                ],
                "offline_fallback": False,
            },
        },
    )
    cfg = session.config
    # the recall share is kept out of what the view itself may use; the threshold is a
    # share of the whole budget, capped at the view's part
    held = reserve_for(BUDGET, cfg.recall)
    _, trigger, _ = thresholds(BUDGET - held, cfg, whole_tokens=BUDGET)
    await session.add_message({"role": "system", "content": "You are a careful DBA."})
    rng = random.Random(20240611)

    sent_at: list[tuple[int, int, list[dict[str, Any]]]] = []  # (turn, head, sent)
    summary_turns: list[int] = []
    post_summary_tokens: list[int] = []
    added_tokens = 0
    summaries_seen = 0
    in_view: list[Any] = []
    for turn in range(TURNS):
        question = {"role": "user", "content": _text(rng, f"Q{turn:03d}", 10, 50)}
        await session.add_message(question)
        added_tokens += session.counter.count_message(question)

        sent = await session.get_messages_for_request(token_budget=BUDGET)
        sent_at.append((turn, session.request_seq, sent))
        assert _tokens(session, sent) <= BUDGET, f"turn {turn} over budget"
        assert sent[0]["role"] == "system" and sent[-1] == question
        if summaries_seen:  # the summary recorded so far serves this request
            assert in_view[0].message["content"] in [m.get("content") for m in sent]
        await session.close()  # summaries are made in the background: let one land

        items = await session.view_items()
        in_view = [i for i in items if i.kind == "summary"]
        written = len(fake_llm.requests)
        if written > summaries_seen:
            assert written == summaries_seen + 1, f"turn {turn}: several summaries at once"
            summaries_seen = written
            summary_turns.append(turn)
            post_summary_tokens.append(await session.get_token_count())
        if summaries_seen:
            assert len(in_view) == 1, f"turn {turn}: {len(in_view)} summaries in the view"
            assert items[1].kind == "summary"  # right after the system message
        else:
            assert in_view == []

        answer = {"role": "assistant", "content": _text(rng, f"A{turn:03d}", 15, 70)}
        await session.add_message(answer)
        added_tokens += session.counter.count_message(answer)

    # the ledger holds every turn
    events: list[Any] = [e async for e in session.events()]
    messages = [e.payload.message for e in events if e.type == "message.appended"]
    assert len([m for m in messages if m["role"] in ("user", "assistant")]) == 2 * TURNS
    assert len(await session.get_messages()) == 2 * TURNS + 1
    assert [m["content"][:4] for m in messages[1::2]] == [f"Q{t:03d}" for t in range(TURNS)]

    # summaries roll: each folds the one before it; every call was answered first time
    summaries = [e for e in events if e.type == "summary.recorded"]
    assert len(summaries) == summaries_seen == len(fake_llm.calls("summarizer"))
    assert summaries and summaries[0].payload.audit["prior_summary_seq"] is None
    for prev, cur in itertools.pairwise(summaries):
        assert cur.payload.audit["prior_summary_seq"] == prev.seq
        assert cur.payload.audit["model"] == "openai/summarizer"
        assert cur.payload.audit["trigger"] == "background"
    for request in fake_llm.calls("summarizer")[1:]:
        assert "<prior_summary>" in request.text

    # no storm: after a summary the view is well under the trigger, and every next
    # summary needs at least that gap of new tokens
    gap = trigger - max(post_summary_tokens)
    bound = added_tokens // gap + 1
    print(
        f"\n{TURNS} turns, {added_tokens} tokens added, trigger {trigger}, "
        f"max view after a summary {max(post_summary_tokens)}, gap {gap}: "
        f"{len(summaries)} summaries (bound {bound}) at turns {summary_turns}"
    )
    # a summary folds what the request's cut passed: one per cut move at most, so the
    # view after it stays well under the trigger and the calls stay far apart
    # (the cell is 0.85 - 0.6 of the budget: from the target of the whole budget to the
    # view's part once recall's share is held back; the summary itself takes some of it)
    assert gap > BUDGET // 6
    assert 2 <= len(summaries) <= bound
    assert len(summaries) <= TURNS // 5

    # replay: what was sent at a turn is what request_at rebuilds from the ledger
    sample = {t for t in range(0, TURNS, 25)} | set(summary_turns) | {TURNS - 1}
    checked = 0
    for turn, head, sent in sent_at:
        if turn in sample:
            replayed = await session.request_at(head, token_budget=BUDGET)
            assert replayed == sent, f"turn {turn} replays differently"
            checked += 1
    assert checked == len(sample) >= 40
