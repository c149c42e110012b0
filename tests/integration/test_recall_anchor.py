"""Recall's search is taken as of the question, and in a tool loop starts at the call.

The lexical search of a request reads the ledger up to the last message its query
reads (the latest human turn, or a tool call after it): what came after (a reply, tool
results) is carried by the request anyway. So a request after the reply recalls what a
request at the question did, ``request_at`` rebuilds either, and on PostgreSQL the
search for the request after a tool's results is started when the call is appended,
running while the tool does.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contextledger import InvalidArgument, Ledger
from contextledger.session import Session
from tests.integration.test_recall import (
    FACT,
    QUESTION,
    chatter,
    indexed,
    message_seqs,
    planted,
    recall_blocks,
)

_ids = itertools.count()


def call(call_id: str, service: str = "orchard-api") -> dict[str, Any]:
    arguments = json.dumps({"service": service, "env": "staging"})
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": call_id,
                "type": "function",
                "function": {"name": "probe_gateway", "arguments": arguments},
            }
        ],
    }


def result(call_id: str, text: str = "probe timed out") -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": text}


def speculation(session: Session) -> tuple[int, int]:
    """(requests that used a search started at a tool call, requests that searched anew)"""
    rp = session._requests
    return rp.speculation_hits, rp.speculation_misses


async def test_a_request_after_the_reply_recalls_what_one_at_the_question_did(
    ledger: Ledger,
) -> None:
    session = await planted(ledger)
    at_question = await session.get_messages_for_request(token_budget=2000)
    question_seq = session.request_seq
    await session.add_message({"role": "assistant", "content": "Checking the gateway."})
    after = await session.get_messages_for_request(token_budget=2000)
    assert [b for b in recall_blocks(at_question) if FACT in b]
    assert [b for b in recall_blocks(after) if FACT in b]
    assert after[-1]["content"] == "Checking the gateway." and after[-2]["content"] == QUESTION
    assert await session.request_at(question_seq, token_budget=2000) == at_question
    assert await session.request_at(session.request_seq, token_budget=2000) == after


async def test_a_tool_loop_request_uses_the_search_started_at_the_call(
    pg_ledger: Ledger,
) -> None:
    session = await planted(pg_ledger)
    await session.get_messages_for_request(token_budget=2000)  # the recall room in force
    await session.add_message(call("c1"))
    await asyncio.sleep(0.05)  # the tool runs; so does the search
    await session.add_message(result("c1"))
    request = await session.get_messages_for_request(token_budget=2000)
    assert speculation(session) == (1, 0)
    (block,) = recall_blocks(request)
    assert FACT in block
    assert request[-1] == result("c1") and request[-2]["tool_calls"][0]["id"] == "c1"
    assert await session.request_at(session.request_seq, token_budget=2000) == request


async def test_a_view_changed_since_the_call_searches_anew_with_the_same_answer(
    pg_ledger: Ledger, pg_dsn: str
) -> None:
    # The next request plans for another budget: its view is not the one the search
    # started at the call was given, so that answer is not used; the request searches.
    session = await planted(pg_ledger)
    await session.get_messages_for_request(token_budget=2000)
    await session.add_message(call("c1"))
    await session.add_message(result("c1"))
    request = await session.get_messages_for_request(token_budget=1500)
    assert speculation(session) == (0, 1)
    assert [b for b in recall_blocks(request) if FACT in b]
    assert await session.request_at(session.request_seq, token_budget=1500) == request
    # another process writes the call's result (this one learns of it at its next append,
    # which finds the head moved): seen, and exact
    await session.add_message(call("c2"))
    async with Ledger.open(pg_dsn) as other:
        twin = await other.session("r")
        await twin.add_message(result("c2", "probe ok"))
    await session.add_message({"role": "assistant", "content": "The probe answered."})
    request = await session.get_messages_for_request(token_budget=1500)
    assert request[-2] == result("c2", "probe ok")
    # the view up to the call is what the search started at c2 was given: used
    assert speculation(session) == (1, 1)
    assert await session.request_at(session.request_seq, token_budget=1500) == request


async def test_a_head_learned_elsewhere_makes_a_remembered_closed_gate_search_again(
    pg_ledger: Ledger, pg_dsn: str
) -> None:
    # A closed gate is remembered while nothing can be left out; then another process rolls
    # back to a checkpoint whose branch holds a fact this process had rolled away, and this
    # process's next request (another budget: the view's tail is read afresh, no head read)
    # leaves that fact out. The search must run, and recall it, as request_at does.
    session = await pg_ledger.session("gate-rb", config={"token_counter": "chars"})
    await session.add_message({"role": "system", "content": "You are a coding agent."})
    start = await session.checkpoint("start")
    await session.add_message({"role": "user", "content": FACT})
    await chatter(session, 12)
    await session.add_message({"role": "user", "content": QUESTION})
    with_fact = await session.checkpoint("with-fact")
    await session.rollback(start)  # the fact leaves the branch
    await session.add_message({"role": "user", "content": "anything else to check?"})
    await session.add_message({"role": "assistant", "content": "No."})
    request = await session.get_messages_for_request(token_budget=100_000)
    assert FACT not in str(request) and not recall_blocks(request)
    async with Ledger.open(pg_dsn) as other:
        await (await other.session("gate-rb")).rollback(with_fact)  # the fact is back
    request = await session.get_messages_for_request(token_budget=900)
    assert request[-1]["content"] == QUESTION and FACT not in str(request[:-2])
    assert [b for b in recall_blocks(request) if FACT in b]
    assert await session.request_at(session.request_seq, token_budget=900) == request


async def test_a_failing_search_started_at_the_call_fails_the_request_typed(
    pg_ledger: Ledger,
) -> None:
    session = await planted(pg_ledger, {"recall": {"text_search_config": "klingon"}})
    with pytest.raises(InvalidArgument):
        await session.get_messages_for_request(token_budget=2000)
    await session.add_message(call("c1"))
    await session.add_message(result("c1"))
    with pytest.raises(InvalidArgument):  # the speculation failed: searched anew, typed
        await session.get_messages_for_request(token_budget=2000)
    # (whether it had failed before the request took it or after, the request searched)
    assert sum(speculation(session)) == 1


async def test_closing_the_session_waits_for_a_search_started_at_a_call(
    pg_ledger: Ledger,
) -> None:
    session = await planted(pg_ledger)
    await session.get_messages_for_request(token_budget=2000)
    await session.add_message(call("c1"))
    spec = session._requests._spec
    assert spec is not None and not spec.task.done()
    await session.close()
    assert spec.task.done() and not spec.task.cancelled() and spec.task.exception() is None
    assert session._requests._spec is None


async def test_a_short_session_skips_the_search_for_a_request_after_the_reply(
    pg_ledger: Ledger, pg_dsn: str
) -> None:
    # Anchored at the question, the search of a request made after the reply is still
    # skipped while nothing can be left out (the closed gate covers seqs up to the head).
    session = await pg_ledger.session("short-reply", config={"token_counter": "chars"})
    await session.add_message({"role": "user", "content": FACT})
    await session.add_message({"role": "assistant", "content": "Noted."})
    await session.get_messages_for_request(token_budget=100_000)
    first = await indexed(pg_ledger, pg_dsn, "short-reply")
    assert first == await message_seqs(session)  # the first search ran (and indexed)
    for i in range(5):
        await session.add_message({"role": "user", "content": f"question {i}?"})
        await session.add_message({"role": "assistant", "content": f"answer {i}."})
        await session.get_messages_for_request(token_budget=100_000)
    assert await indexed(pg_ledger, pg_dsn, "short-reply") == first  # skipped each time
    await chatter(session, 40)  # the fact falls out of a small budget
    await session.add_message({"role": "user", "content": QUESTION})
    await session.add_message({"role": "assistant", "content": "Looking."})
    blocks = recall_blocks(await session.get_messages_for_request(token_budget=2000))
    assert len(blocks) == 1 and FACT in blocks[0]


step = st.sampled_from(["user", "reply", "call", "calls", "result", "request", "request"])


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    steps=st.lists(step, min_size=1, max_size=40),
    budgets=st.lists(st.sampled_from([700, 900, 1400]), min_size=1, max_size=3),
)
async def test_every_request_of_a_tool_loop_is_rebuilt_exactly(
    pg_ledger: Ledger, steps: list[str], budgets: list[int]
) -> None:
    # Whatever the mix of turns, calls, results and requests (and budgets), every request
    # is what request_at rebuilds from the ledger, speculation or not.
    session = await pg_ledger.session(f"loop-{next(_ids)}", config={"token_counter": "chars"})
    await session.add_message({"role": "user", "content": FACT})
    await chatter(session, 12)
    sent: list[tuple[int, int, list[dict[str, Any]]]] = []
    open_calls: list[str] = []
    for n, kind in enumerate(steps, start=1):
        # a turn or a reply while calls are open: the write path answers them (synthetic)
        if kind == "user":
            await session.add_message({"role": "user", "content": f"{QUESTION} ({n})"})
            open_calls = []
        elif kind == "reply":
            await session.add_message({"role": "assistant", "content": f"reply {n}"})
            open_calls = []
        elif kind in ("call", "calls"):
            made = [call(f"c{n}", service=f"svc{n % 3}")]
            if kind == "calls":  # parallel calls in one message
                made[0]["tool_calls"] += call(f"d{n}", service="gateway")["tool_calls"]
            await session.add_message(made[0])
            open_calls = [c["id"] for c in made[0]["tool_calls"]]
        elif kind == "result" and open_calls:
            await session.add_message(result(open_calls.pop(0), f"output {n} " * (n % 5)))
        elif kind == "request":
            budget = budgets[n % len(budgets)]
            request = await session.get_messages_for_request(token_budget=budget)
            sent.append((session.request_seq, budget, request))
    for seq, budget, request in sent:
        assert await session.request_at(seq, token_budget=budget) == request
