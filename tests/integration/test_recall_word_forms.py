"""A question asks with a verb's base form ("when did we drive it?"), the turn that
answers it told the past ("we drove the van"): stemming never joins irregular forms, so
recall searches a query with the other forms of its irregular words (``core.word_forms``).
On both stores, on PostgreSQL's warm path and its SQL statement (the one Citus runs), in
a request that replays the same, and without costing a lexed append its skipped
catch-up."""

from __future__ import annotations

from typing import Any

import asyncpg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contextledger import Ledger, Session
from contextledger.core.word_forms import most_lexemes
from contextledger.store.dsn import asyncpg_dsn
from contextledger.store.lexical import tokenize
from contextledger.store.memory import MemoryStore
from tests.examples import examples
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
    # PostgreSQL's parser makes "-8" and "ab" of "-8ab", "8ab" of "8ab" (and of the
    # 2-letter lexemes, "ed" sorts last: the one a 13th pushes out)
    "signed numbers": ["Ed wrote -8ab margins, not 8ab, on the Leeds header Bo built."],
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


#: Words a parser splits in ways a question's words seldom are
TRICKY = [
    "-8px", "+3pm", "8px", "19--19", "UTC-5", "/tmp", "~/src", "~/it", "/the", "com+0x1f",
    "three-year-old", "ab-cd@ef-gh", "a.b@c-d.org", "https://ex.com/a/b-c?x=1", "1.2.3",
    "v2.0", "x\u00b2y", "H\u2082O", "Jos\u00e9", "\u65e5\u672c\u8a9e", "\U0001f600", "snake_case",
    "can't", "Tim's", "co-op", "--", "it", "the", "drive", "went", "children", "Ed", "Jo",
    "(went", "gone)", "e-mail", "10:30", "$5", "#42", "C++", "foo.bar", "well-known",
]  # fmt: skip


@settings(
    max_examples=examples(150),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(st.lists(st.sampled_from(TRICKY), min_size=1, max_size=14).map(" ".join))
async def test_the_guard_counts_at_least_the_lexemes_either_parser_makes(
    pg_dsn: str, text: str
) -> None:
    """``most_lexemes`` is an upper bound for PostgreSQL's ``english`` parser (the server
    under test) and ``memory://``'s tokenizer: so forms never push a lexeme out."""
    conn = await asyncpg.connect(asyncpg_dsn(pg_dsn))
    try:
        made = await conn.fetchval(
            "SELECT cardinality(tsvector_to_array(to_tsvector('english', $1)))", text
        )
    finally:
        await conn.close()
    assert most_lexemes(text) >= made
    assert most_lexemes(text) >= len(set(tokenize(text, "english")))


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
