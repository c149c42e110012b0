"""A question asks with a verb's base form ("when did we drive it?"), the turn that
answers it told the past ("we drove the van"): stemming never joins irregular forms, so
recall searches a query with the other forms of its irregular words (``core.word_forms``).
On both stores, on PostgreSQL's warm path and its SQL statement (the one Citus runs), in
a request that replays the same, and without costing a lexed append its skipped
catch-up."""

from __future__ import annotations

from typing import Any

import pytest

from contextledger import Ledger, Session
from contextledger.store.memory import MemoryStore
from tests.integration.test_recall import planted, recall_blocks
from tests.integration.test_recall_lexed_appends import call, replays_agree, warm_of

BUDGET = 2000
#: (told, asked): no word in common, on either store's tokenizer, but a verb's forms
#: (and the chatter has neither)
CASES = [
    ("Finally drove the van over the Tagus bridge.", "When did you drive?"),
    ("Remind me to buy a ladder for the attic.", "What have I bought lately?"),
    ("Ana and I met at the harbour cafe on Friday.", "Where did we meet?"),
    ("Our youngest child starts swimming lessons soon.", "How old are the children?"),
]


async def told_then_asked(
    ledger: Ledger, told: str, asked: str, config: Any = None, *, sid: str = "v"
) -> Session:
    return await planted(ledger, config, fact=told, question=asked, sid=sid)


@pytest.mark.parametrize(("told", "asked"), CASES)
async def test_a_verb_asked_in_one_form_finds_the_turn_told_in_another(
    ledger: Ledger, told: str, asked: str
) -> None:
    session = await told_then_asked(ledger, told, asked)
    request = await session.get_messages_for_request(token_budget=BUDGET)
    assert any(told in block for block in recall_blocks(request))
    assert request[-1]["content"] == asked  # the turn is sent as it was said
    assert await session.request_at(session.head, token_budget=BUDGET) == request


@pytest.mark.parametrize(("told", "asked"), CASES[:1])
async def test_the_sql_statement_searches_the_same_forms(
    pg_ledger: Ledger, told: str, asked: str
) -> None:
    """A schema-qualified configuration is not the warm index's: the search is the SQL
    statement (``_sql_search``, the one Citus runs), which tokenizes the same text."""
    config = {"recall": {"text_search_config": "pg_catalog.english"}}
    session = await told_then_asked(pg_ledger, told, asked, config)
    request = await session.get_messages_for_request(token_budget=BUDGET)
    assert any(told in block for block in recall_blocks(request))
    assert await session.request_at(session.head, token_budget=BUDGET) == request


async def test_another_configuration_searches_the_turn_alone(ledger: Ledger) -> None:
    """The forms are English words: under ``simple`` (or any configuration but English)
    the query is the turn's own text, so "went" is not searched for "go"."""
    told, asked = "Went up to the lighthouse at dawn.", "Where did you go?"
    found = {}
    for config in ("english", "simple"):
        session = await told_then_asked(
            ledger, told, asked, {"recall": {"text_search_config": config}}, sid=config
        )
        request = await session.get_messages_for_request(token_budget=BUDGET)
        found[config] = any(told in block for block in recall_blocks(request))
    assert found == {"english": True, "simple": False}


#: Queries where added forms would push a short name (``ed``) out of the 12 lexemes a
#: search looks up: a hyphenated word is several lexemes; a tool loop's query is the turn
#: and its calls together; ``memory://`` keeps words PostgreSQL drops ("where", "you").
DISPLACING = {
    "hyphenated": ["Did Ed and Bo drive the three-year-old and six-month-old to Oslo?"],
    # (the call's words bring the query to the cap of each store's tokenizer: memory://
    # keeps "which", "did", "over", PostgreSQL drops them)
    "tool loop": [
        "Which city did Ed drive to over the weekend?",
        '{"query": "weekend trip city history travel museum harbour"}',
        '{"query": "weekend trip city harbour"}',
    ],
    "kept words": ["Where did you and Ed go with the kids when she drove to Leeds?"],
}


@pytest.mark.parametrize("case", sorted(DISPLACING))
async def test_forms_never_push_the_query_s_own_words_out(ledger: Ledger, case: str) -> None:
    told = "Ed has the spare car seats."
    turn, *calls = DISPLACING[case]
    if calls:
        calls = calls[1:] if isinstance(ledger.store, MemoryStore) else calls[:1]
    session = await told_then_asked(ledger, told, turn)
    for n, arguments in enumerate(calls):
        function = {"name": "lookup", "arguments": arguments}
        await session.add_message(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": f"c{n}", "type": "function", "function": function}],
            }
        )
    request = await session.get_messages_for_request(token_budget=BUDGET)
    assert any(told in block for block in recall_blocks(request))


async def test_a_tool_loop_asking_with_irregular_verbs_still_skips_its_catch_ups(
    pg_dsn: str,
) -> None:
    """A lexed append guesses the query the next request searches (``warm.query_of``): the
    forms are added to each part as ``core.recall.search_text`` adds them, so the guess
    holds through the calls of a tool loop and no request catches up."""
    told, asked = CASES[0]
    requests: dict[int, Any] = {}
    async with Ledger.open(pg_dsn) as ledger:
        session = await told_then_asked(ledger, told, asked)
        await session.get_messages_for_request(BUDGET)
        warm = warm_of(ledger)
        before = warm.caught_up
        for turn in range(2):
            await session.add_message({"role": "user", "content": f"{asked} ({turn})"})
            requests[session.head] = await session.get_messages_for_request(BUDGET)
            await session.add_message(call(turn, f"where the van went on day {turn}"))
            requests[session.head] = await session.get_messages_for_request(BUDGET)
            await session.add_message(
                {"role": "tool", "tool_call_id": f"c{turn}", "content": "no record"}
            )
            requests[session.head] = await session.get_messages_for_request(BUDGET)
            await session.add_message({"role": "assistant", "content": "On the bridge."})
        assert warm.caught_up - before == len(requests) == 6
        assert all(any(told in b for b in recall_blocks(r)) for r in requests.values())
    await replays_agree(pg_dsn, "v", requests)
