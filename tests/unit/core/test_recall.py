"""The pure recall picker: budget, whole tool units, original order, determinism."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contextledger.core.config import ContextConfig
from contextledger.core.recall import (
    MAX_LINE_CHARS,
    RECALL_OPEN,
    ROOM_KINDS,
    RRF_K,
    RecallBlock,
    Recalled,
    asks_about_past,
    fuse,
    give_back,
    latest_turn,
    leaves_out,
    make_room,
    message_text,
    pick,
    place,
    query_anchor,
    query_end,
    query_text,
    room_start,
    speaker,
    strong_matches,
    units_of,
    with_hops,
    with_neighbours,
)
from contextledger.core.tokens import TokenCounter, get_counter
from contextledger.core.units import result_ids, tool_calls
from contextledger.core.view import ViewItem
from contextledger.errors import ConfigError
from tests.examples import examples
from tests.unit.strategies import (
    COUNTER,
    Spec,
    anthropic_call,
    anthropic_results,
    assistant,
    items,
    openai_call,
    openai_result,
    user,
)

WORDS = ("port", "gateway", "18443", "owner", "ops@acme.io", "deploy", "schema", "freeze")


DAYS = [datetime(2023, 5, d, 13, 56, tzinfo=UTC) for d in (8, 9, 25)]
#: The counters a block is picked with: characters (rounding up), and a real BPE
#: tokenizer, whose counts of joined text, digits and JSON differ from the parts'.
COUNTERS = (COUNTER, get_counter("tiktoken", "gpt-4o"))
#: A run of text a tokenizer takes one token a character or more: a clipped line's first
#: 600 characters can cost far more than their share of the message's count.
DENSE = "".join(chr(0x1F300 + (n * 37) % 256) for n in range(700))


@st.composite
def left_out(draw: st.DrawFn, counter: TokenCounter) -> list[Recalled]:
    """Seq-ordered left-out messages: plain turns (some named, some long enough to clip,
    some dense), OpenAI and Anthropic tool units, content blocks, with gaps in seq, at
    small seqs or six-digit ones; counted at append and dated (as the stores give them:
    the picker estimates from the counts), or not, or some of each."""
    counted = draw(st.sampled_from(["all", "none", "some"]))
    out: list[Recalled] = []

    def add(seq: int, message: dict[str, Any]) -> None:
        if counted == "all" or (counted == "some" and draw(st.booleans())):
            at = DAYS[draw(st.integers(0, len(DAYS) - 1))]
            out.append(Recalled(seq, message, counter.count_message(message), at))
        else:
            out.append(Recalled(seq, message))

    seq = draw(st.sampled_from([1, 3, 5, 135_791, 999_998]))
    for n in range(draw(st.integers(0, 12))):
        text = " ".join(draw(st.lists(st.sampled_from(WORDS), min_size=1, max_size=30)))
        text *= draw(st.sampled_from([1, 1, 1, 12]))  # some past the line's clip
        shape = draw(
            st.sampled_from(["turn", "turn", "dense", "edge", "blocks", "openai", "anthropic"])
        )
        if shape in ("turn", "dense", "edge", "blocks"):
            role = draw(st.sampled_from(["user", "assistant"]))
            if shape == "dense":
                content: Any = DENSE + " " * 2000
            elif shape == "edge":  # just past the clip: the line is the text bar a letter
                content = ("word " * 200)[: MAX_LINE_CHARS - 1] + " x"
            elif shape == "blocks":
                content = [{"type": "text", "text": w} for w in text.split()[:40]]
            else:
                content = text
            turn = {"role": role, "content": content}
            name = draw(st.sampled_from([None, None, "Caroline", "Ann [ops]\n", "Zoë " * 20]))
            add(seq, turn if name is None else {**turn, "name": name})
            seq += 1
        else:
            ids = [f"c{n}_{k}" for k in range(draw(st.integers(1, 3)))]
            if shape == "openai":
                call = openai_call([(i, "grep") for i in ids])
                for c in call["tool_calls"]:
                    c["function"]["arguments"] = {w: n for n, w in enumerate(text.split()[:20])}
                add(seq, call)
            else:
                call = anthropic_call([(i, "grep") for i in ids], text="Looking.")
                for c in call["content"][1:]:
                    c["input"] = {w: n for n, w in enumerate(text.split()[:20])}
                add(seq, call)
            seq += 1
            for i in ids:
                if shape == "openai":
                    add(seq, openai_result(i, text))
                else:
                    add(seq, anthropic_results([(i, [{"type": "text", "text": text}])]))
                seq += 1
        seq += draw(st.integers(0, 2))  # a gap: something in the view, or on no branch
    return out


@st.composite
def recall_cases(
    draw: st.DrawFn,
) -> tuple[list[int], list[Recalled], int, TokenCounter]:
    counter = draw(st.sampled_from(COUNTERS))
    messages = draw(left_out(counter))
    seqs = [m.seq for m in messages]
    ranked = draw(st.permutations(seqs)) if seqs else []
    ranked = ranked[: draw(st.integers(0, len(ranked)))]
    return list(ranked), messages, draw(st.integers(0, 1200)), counter


def _unit_seqs(messages: list[Recalled]) -> dict[int, tuple[int, ...]]:
    return {r.seq: tuple(x.seq for x in unit) for unit in units_of(messages) for r in unit}


@settings(max_examples=examples(200), deadline=None)
@given(recall_cases())
def test_pick_keeps_budget_whole_units_order_and_is_deterministic(
    case: tuple[list[int], list[Recalled], int, TokenCounter],
) -> None:
    ranked, messages, budget, counter = case
    block = pick(ranked, messages, budget_tokens=budget, counter=counter, query="q")
    again = pick(ranked, list(reversed(messages)), budget_tokens=budget, counter=counter, query="q")
    assert block == again  # input order of the fetched messages does not matter
    if block.message is None:
        assert block.seqs == () and block.tokens == 0
        return
    # within budget, counted or estimated (an upper bound of the count)
    real = counter.count_message(block.message)
    assert real <= block.tokens <= budget
    assert list(block.seqs) == sorted(block.seqs)  # original order
    units = _unit_seqs(messages)
    chosen = set(block.seqs)
    for seq in block.seqs:
        assert set(units[seq]) <= chosen  # tool units whole
    # every chosen unit holds a ranked match
    assert all(set(units[s]) & set(ranked) for s in block.seqs)
    content = str(block.message["content"])
    assert content.startswith(RECALL_OPEN)
    assert all(f"[#{s} " in content for s in block.seqs)  # each line marked with its seq


@settings(max_examples=examples(200), deadline=None)
@given(recall_cases(), st.integers(1, 400))
def test_a_bigger_share_never_recalls_less_of_the_best_match(
    case: tuple[list[int], list[Recalled], int, TokenCounter], more: int
) -> None:
    # (a token more, too: the best unit is taken at its count, not its estimate, so the
    # passes that fill a block near its budget never let it in below a budget it misses)
    ranked, messages, budget, counter = case
    small = pick(ranked, messages, budget_tokens=budget, counter=counter)
    large = pick(ranked, messages, budget_tokens=budget + more, counter=counter)
    if ranked and small.seqs and ranked[0] in small.seqs:
        assert ranked[0] in large.seqs


def test_units_break_at_a_gap_and_take_their_results() -> None:
    call = Recalled(3, openai_call([("a", "grep"), ("b", "grep")]))
    ra, rb = Recalled(4, openai_result("a", "x")), Recalled(5, openai_result("b", "y"))
    late = Recalled(7, openai_result("a", "z"))  # after a gap: its own unit
    assert [tuple(r.seq for r in u) for u in units_of([call, ra, rb, late])] == [(3, 4, 5), (7,)]


def test_a_matched_result_brings_its_call() -> None:
    call = Recalled(10, openai_call([("k", "describe_service")]))
    result = Recalled(11, openai_result("k", '{"owner": "ops@acme.io"}'))
    block = pick([11], [call, result], budget_tokens=500, counter=COUNTER)
    assert block.seqs == (10, 11)
    assert "ops@acme.io" in str(block.message and block.message["content"])


def test_a_unit_too_big_for_the_share_is_skipped_whole() -> None:
    big = Recalled(2, user("gateway " * 400))
    small = Recalled(9, user("the gateway port is 18443"))
    block = pick([2, 9], [big, small], budget_tokens=120, counter=COUNTER)
    assert block.seqs == (9,)
    roomy = pick([2, 9], [big, small], budget_tokens=400, counter=COUNTER)
    assert roomy.seqs == (2, 9)  # clipped to MAX_LINE_CHARS, the long one fits a bigger share
    assert "[...]" in str(roomy.message and roomy.message["content"])


def test_query_is_the_latest_human_turn_and_a_pending_call() -> None:
    view = items(
        [
            user("old question about the schema"),
            Spec(user("summary: we discussed ports"), kind="summary"),
            user("which port does the gateway use?"),
            anthropic_call([("t1", "read_file")], text="reading"),
            anthropic_results([("t1", "ok")]),
        ]
    )
    text = query_text(view)
    assert "which port" in text and "reading" in text and "old question" not in text
    assert query_text(items([assistant("hello")])) == ""


def test_a_search_is_anchored_at_the_last_message_its_query_reads() -> None:
    # seqs 10.. : the question (11), a reply, a tool call (13), its result, a reply
    view = items(
        [
            user("old"),
            user("which port does the gateway use?"),
            assistant("let me look"),
            openai_call([("c1", "read_file")]),
            openai_result("c1", "8443"),
            assistant("8443"),
        ],
        first_seq=10,
    )
    assert query_end(view) == 3 and query_anchor(view, head=15) == 13
    no_call = view[:3]
    assert query_end(no_call) == 1 and query_anchor(no_call, head=12) == 11
    # no human turn: nothing to search for, the request's own seq
    assert query_end(items([assistant("hi")])) is None
    assert query_anchor(items([assistant("hi")]), head=4) == 4
    # a question that is not in the ledger (an ephemeral message) anchors at the head
    ephemeral = (*view[:2], ViewItem((-12, 0), 12 * 10**6 + 5, user("now?"), 3, kind="ephemeral"))
    assert query_anchor(ephemeral, head=12) == 12


@given(st.lists(st.sampled_from(["u", "a", "c", "r"]), min_size=1, max_size=30))
def test_an_anchor_never_passes_the_head_and_reads_the_query_s_last_message(
    shape: list[str],
) -> None:
    made = {"u": user("q"), "a": assistant("x"), "c": openai_call([("c", "f")]),
            "r": openai_result("c", "ok")}  # fmt: skip
    view = items([made[k] for k in shape])
    head = len(shape)
    end = query_end(view)
    anchor = query_anchor(view, head)
    assert 1 <= anchor <= head
    if end is None:
        assert "u" not in shape and anchor == head
    else:
        assert view[end].seq == anchor and shape[end] in "uc"
        assert "u" not in shape[end + 1 :] and "c" not in shape[end + 1 :]


def test_message_text_covers_tool_arguments_and_results() -> None:
    call: dict[str, Any] = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "x",
                "type": "function",
                "function": {"name": "set_config", "arguments": '{"max_workers": 37}'},
            }
        ],
    }
    assert "set_config" in message_text(call) and "37" in message_text(call)
    blocks = anthropic_results([("x", [{"type": "text", "text": "port 18443"}])])
    assert "18443" in message_text(blocks)
    assert tool_calls(call) and result_ids(blocks) == ("x",)


def test_place_puts_the_block_before_the_latest_turn() -> None:
    view = items([user("a"), assistant("b"), user("c"), openai_call([("z", "grep")])])
    block = RecallBlock({"role": "user", "content": "<recall>x</recall>"}, (1,), 5, "c")
    placed = place(view, block)
    assert [i.message["content"] for i in placed][:4] == ["a", "b", "<recall>x</recall>", "c"]
    assert [i.ord for i in placed] == sorted(i.ord for i in placed)
    assert place(view, RecallBlock(None, (), 0, "")) == view
    assert place(items([assistant("only")]), block) == items([assistant("only")])


def test_recall_config_defaults_and_errors() -> None:
    cfg = ContextConfig.from_mapping({})
    assert cfg.recall.enabled and cfg.recall.share == 0.15 and cfg.recall.engine == "lexical"
    merged = cfg.merged({"recall": {"share": 0.2}})
    assert merged.recall.share == 0.2 and merged.recall.enabled
    assert ContextConfig.from_mapping(merged.to_dict()) == merged
    for bad, key in [
        ({"share": 0}, "recall.share"),
        ({"share": 0.9}, "recall.share"),
        ({"enabled": "yes"}, "recall.enabled"),
        ({"engine": "vector"}, "recall.engine"),
        ({"engine": "hybrid"}, "recall.embedding_model"),
        ({"text_search_config": "english; drop table"}, "recall.text_search_config"),
        ({"max_matches": 0}, "recall.max_matches"),
        ({"colour": 1}, "recall.colour"),
    ]:
        with pytest.raises(ConfigError) as err:
            ContextConfig.from_mapping({"recall": bad})
        assert err.value.details["key"] == key


def test_embedding_key_is_redacted() -> None:
    cfg = ContextConfig.from_mapping(
        {"recall": {"engine": "hybrid", "embedding_model": "m", "embedding_api_key": "sk-1"}}
    )
    assert cfg.to_dict()["recall"]["embedding_api_key"] == "***"
    assert cfg.recall.embedding_api_key == "sk-1"


# -- room for what is asked, neighbours, dates ---------------------------------------


@pytest.mark.parametrize(
    ("turn", "asks"),
    [
        ("What port does the gateway use?", True),
        ("when did we freeze the schema", True),
        ("Remind me of the owner", True),
        ("Do you remember the vendor we picked", True),
        ("As I said earlier, deploy on friday.", True),
        ("Deploy it now.", False),
        ("Please tidy the caching module", False),
        ("", False),
    ],
)
def test_a_turn_asks_about_the_past_when_it_is_a_question_or_points_back(
    turn: str, asks: bool
) -> None:
    assert asks_about_past(turn) is asks


def test_room_is_made_from_the_oldest_messages_never_the_latest_turn_or_a_split_unit() -> None:
    view = items(
        [
            {"role": "system", "content": "sys"},
            user("a" * 40),
            openai_call([("c1", "grep")]),
            openai_result("c1", "b" * 40),
            assistant("c" * 40),
            user("what now?"),
        ]
    )
    assert room_start(view) == 1
    tokens = [i.tokens for i in view]
    # room for the first user turn only
    assert make_room(view, tokens[1]) == 2
    # the call fits but its result does not: the cut never leaves the result alone
    assert make_room(view, tokens[1] + tokens[2]) == 2
    assert make_room(view, sum(tokens[1:4])) == 4
    # never the latest human turn, whatever the room
    assert make_room(view, 10**6) == 5
    assert make_room(view, 0) == 1


def test_what_the_block_leaves_unused_goes_back_newest_first() -> None:
    view = items([user("a" * 40), user("b" * 40), openai_call([("c1", "g")]),
                  openai_result("c1", "x" * 40), user("q?")])  # fmt: skip
    tokens = [i.tokens for i in view]
    # room for the last two (a call and its result) comes back whole, or not at all
    assert give_back(view, 0, 4, tokens[2] + tokens[3], set()) == list(view[2:4])
    assert give_back(view, 0, 4, tokens[3], set()) == []  # only the result fits: nothing
    assert give_back(view, 0, 4, 10**6, set()) == list(view[:4])
    # a message the block recalled does not come back (no line said twice), the rest does
    assert give_back(view, 0, 4, 10**6, {view[1].seq}) == [view[0], view[2], view[3]]
    assert give_back(view, 0, 4, tokens[0] + tokens[2] + tokens[3], {view[1].seq}) == [
        view[0],
        view[2],
        view[3],
    ]


def _make_room_by_steps(view: Sequence[ViewItem], tokens: int) -> int:
    """``make_room`` as its rule reads, one item at a time (what the fast one must equal)."""
    start, last = room_start(view), latest_turn(view)
    if last is None or tokens <= 0:
        return start
    best, used = start, 0
    for index in range(start, last):
        if view[index].kind not in ROOM_KINDS:
            break
        used += view[index].tokens
        if used > tokens:
            break
        if not result_ids(view[index + 1].message):
            best = index + 1
    return best


def _give_back_by_steps(
    view: Sequence[ViewItem], start: int, end: int, spare: int, taken: set[int]
) -> list[ViewItem]:
    """``give_back`` as its rule reads, one item at a time."""
    cut, used = end, 0
    for index in range(end - 1, start - 1, -1):
        if view[index].seq in taken:
            continue
        used += view[index].tokens
        if used > spare:
            break
        if not result_ids(view[index].message):
            cut = index
    return [item for item in view[cut:end] if item.seq not in taken]


@st.composite
def rooms(draw: st.DrawFn) -> tuple[tuple[ViewItem, ...], int, set[int]]:
    """A view of turns, tool units (one or two results), summaries and ephemeral items
    (random counts), a room and seqs a block took."""
    specs: list[dict[str, Any]] = []
    if draw(st.booleans()):
        specs.append({"role": "system", "content": "sys"})
    for n in range(draw(st.integers(0, 30))):
        shape = draw(st.sampled_from(["user", "assistant", "unit", "unit2"]))
        if shape == "user":
            specs.append(user("q " * draw(st.integers(0, 9))))
        elif shape == "assistant":
            specs.append(assistant("a " * draw(st.integers(0, 9))))
        else:
            ids = [f"c{n}", f"d{n}"][: 2 if shape == "unit2" else 1]
            specs.append(openai_call([(i, "grep") for i in ids]))
            specs.extend(openai_result(i, "r " * draw(st.integers(0, 5))) for i in ids)
    view = list(items(specs))
    kinds = st.sampled_from(["message", "message", "synthetic", "summary", "ephemeral"])
    view = [
        replace(item, kind=draw(kinds), tokens=draw(st.integers(0, 40)))
        if item.message.get("role") != "system"
        else item
        for item in view
    ]
    taken = set(draw(st.lists(st.sampled_from([i.seq for i in view] or [0]), max_size=6)))
    return tuple(view), draw(st.integers(-5, 400)), taken


@settings(max_examples=examples(300), deadline=None)
@given(rooms())
def test_making_room_and_giving_back_follow_their_rules_item_by_item(
    case: tuple[tuple[ViewItem, ...], int, set[int]],
) -> None:
    view, tokens, taken = case
    assert make_room(view, tokens) == _make_room_by_steps(view, tokens)
    start = room_start(view)
    for end in range(start, len(view) + 1):
        assert give_back(view, start, end, tokens, taken) == _give_back_by_steps(
            view, start, end, tokens, taken
        )


def test_only_a_request_that_leaves_something_out_widens() -> None:
    view = items([user("a" * 40), user("q?")])
    whole = sum(i.tokens for i in view)
    assert not leaves_out(whole, view)
    assert leaves_out(whole + 1, view)


def test_a_summary_leaves_detail_out_and_its_room_may_go_to_recall() -> None:
    """A request carrying a summary leaves out what the summary covers, even when the
    whole view fits; a question's wider recall may take the summary's room with the
    oldest messages' (unused room gives it back), never the latest turn's."""
    view = items(
        [
            {"role": "system", "content": "sys"},
            Spec({"role": "user", "content": "summary of the first days " * 8}, kind="summary"),
            user("a" * 40),
            assistant("b" * 40),
            user("what was the port?"),
        ]
    )
    whole = sum(i.tokens for i in view)
    assert leaves_out(whole, view)
    tokens = [i.tokens for i in view]
    assert make_room(view, tokens[1]) == 2
    assert make_room(view, sum(tokens[1:4])) == 4
    assert make_room(view, 10**6) == 4


def test_neighbours_follow_the_next_match() -> None:
    assert with_neighbours([10, 20, 30], {9, 11, 19, 31, 40}) == [10, 20, 9, 11, 30, 19, 31]
    assert with_neighbours([10, 11], {9, 10, 11, 12}) == [10, 11, 9, 12]
    assert with_neighbours([], {1}) == []


def test_a_tight_block_is_filled_to_its_budget() -> None:
    """Counted at append, the lines are estimated; most carry no date and none a message's
    overhead: the block is filled up to the last line that fits, not to what the dearest
    estimates left (~70% of the budget before the second pass)."""
    said = [
        f"Caroline: on day {n} I went {WORDS[n % 8]} and then {WORDS[(n * 3) % 8]} with "
        f"Melanie, {n * 7} minutes from the {WORDS[(n * 5) % 8]}"
        for n in range(80)
    ]
    recs = [
        Recalled(n + 1, user(t), COUNTER.count_message(user(t)), DAYS[n * len(DAYS) // 80])
        for n, t in enumerate(said)
    ]
    budget = 1200
    block = pick([r.seq for r in recs], recs, budget_tokens=budget, counter=COUNTER)
    assert block.message is not None
    real = COUNTER.count_message(block.message)
    assert real == block.tokens <= budget  # counted, being near the budget
    line = max(COUNTER.count_message(user(t)) for t in said)
    assert real > budget - line  # no line left that would have fit
    assert len(block.seqs) < len(recs)


def test_once_the_best_match_fits_every_bigger_budget_takes_it() -> None:
    tokens = get_counter("tiktoken", "gpt-4o")
    texts = {1003: "quantum the some", 1004: "brown", 1006: "quick more fox zebra " * 15}
    day = {1003: DAYS[0], 1004: DAYS[0], 1006: DAYS[1]}
    recs = [
        Recalled(s, assistant(t), tokens.count_message(assistant(t)), day[s])
        for s, t in texts.items()
    ]
    taken = [
        1006 in pick([1006, 1003, 1004], recs, budget_tokens=b, counter=tokens).seqs
        for b in range(100, 200)
    ]
    first = taken.index(True)  # (a ValueError if no budget here takes it)
    assert first > 0 and all(taken[first:])  # never again without it, once in


def test_what_the_last_pass_adds_is_shed_before_what_fitted_without_it() -> None:
    """The last pass adds lines at the costs the count scales (here the short lines'): a
    dense line it lets in runs over, and goes again first, not the lines that fitted."""
    tokens = get_counter("tiktoken", "gpt-4o")
    dense = "我们昨天在会议上讨论了新的项目计划以及预算安排大家都同意下周开始" * 3
    texts = {10: "ok", 12: dense[:80], 14: "yes", 16: "fine"}
    recs = [Recalled(s, user(t), tokens.count_message(user(t)), DAYS[0]) for s, t in texts.items()]
    for budget in range(60, 160):
        block = pick(list(texts), recs, budget_tokens=budget, counter=tokens)
        fits = [s for s in (10, 14, 16) if s in block.seqs]
        alone = pick([10, 14, 16], recs, budget_tokens=budget, counter=tokens)
        assert fits == list(alone.seqs) or 12 in block.seqs, budget
        assert block.message is None or tokens.count_message(block.message) <= budget


def test_a_long_result_or_a_long_thought_is_a_short_line_and_fits_a_tight_block() -> None:
    """A message counted at append far above what its line shows (a tool's 20,000
    characters of output, clipped to 600; a reasoning model's thoughts, not shown) is
    recalled where its line fits, not where its count would."""
    tokens = get_counter("tiktoken", "gpt-4o")
    output = openai_result("c1", "the build passed on port 18443 " * 650)
    thought = {"role": "assistant", "content": "Port 18443.", "reasoning_content": "hm " * 4000}
    recs = [Recalled(7, m, tokens.count_message(m), DAYS[0]) for m in (output,)]
    recs.append(Recalled(9, thought, tokens.count_message(thought), DAYS[0]))
    assert min(r.tokens for r in recs) > 4000
    block = pick([7, 9], recs, budget_tokens=400, counter=tokens)
    assert block.seqs == (7, 9) and "[...]" in str(block.message and block.message["content"])
    assert tokens.count_message(block.message or {}) <= block.tokens <= 400


def test_a_line_names_its_speaker_as_a_line_can_carry_it() -> None:
    assert speaker({"role": "user", "name": "Caroline"}) == "Caroline"
    assert speaker({"role": "user", "name": " Ann ] [ops]\n\t x "}) == "Ann ops x"
    assert speaker({"role": "user", "name": "é" * 100}) == "é" * 64
    assert speaker({"role": "user"}) is speaker({"role": "user", "name": 7}) is None
    assert speaker({"role": "user", "name": "[]"}) is None
    recs = [Recalled(3, {**user("I went to Lisbon"), "name": "Caroline"}), Recalled(4, user("Ok"))]
    block = pick([3, 4], recs, budget_tokens=400, counter=COUNTER)
    assert block.message is not None
    lines = str(block.message["content"]).splitlines()[2:-1]
    assert lines == ["[#3 user Caroline] I went to Lisbon", "[#4 user] Ok"]


def test_lines_are_dated_where_the_day_changes() -> None:
    day1 = datetime(2023, 5, 8, 13, 56, tzinfo=UTC)
    day2 = datetime(2023, 5, 25, 9, 0, tzinfo=UTC)
    recs = [
        Recalled(3, user("I went to Lisbon"), 6, day1),
        Recalled(4, assistant("Lovely"), 4, day1),
        Recalled(40, user("Back home"), 4, day2),
    ]
    block = pick([3, 4, 40], recs, budget_tokens=400, counter=COUNTER)
    assert block.message is not None
    lines = str(block.message["content"]).splitlines()[2:-1]  # after the frame's two lines
    assert lines == [
        "[#3 2023-05-08 user] I went to Lisbon",
        "[#4 assistant] Lovely",
        "[#40 2023-05-25 user] Back home",
    ]


_RANKING = st.lists(st.integers(1, 60), unique=True, max_size=40)


@settings(max_examples=examples(300))
@given(_RANKING, _RANKING)
def test_fusion_keeps_each_ranker_s_best_near_the_top(
    lexical: list[int], nearest: list[int]
) -> None:
    """A block holds a few lines: whatever the other ranker says, each one's best stays among
    the fused first 2k + 4, and the fused list holds every candidate once."""
    fused = fuse([lexical, nearest])
    assert sorted(fused) == sorted(set(lexical) | set(nearest))
    for ranking in (lexical, nearest):
        if ranking:
            assert fused.index(ranking[0]) < 2 * RRF_K + 4


def test_a_lexical_best_the_embeddings_missed_is_not_buried_by_their_agreement() -> None:
    """The pattern behind hybrid's losses on bench/conversations.py: the question's best
    lexical match is absent from the nearest-by-embedding list, and fifteen weaker
    candidates are on both lists. At the paper's k (60) it came 16th, past the block."""
    shared = list(range(1, 16))
    fused = fuse([[99, *shared], shared])
    assert fused.index(99) <= 7
    assert fused[0] == 1  # agreement still counts: first on both lists is first


def test_a_hop_follows_the_strong_matches_the_fused_first_matches_hold() -> None:
    matches = [(10, 4.0), (20, 3.0), (30, 1.0), (40, 3.5), (7, -1.0)]  # 7: the hop's
    fused = [10, 5, 20, 6, 30, 11, 12, 40]  # 40 strong, but below the first four
    strong = strong_matches(matches, fused[:4], share=0.5)
    assert strong == {10, 20}
    assert with_hops(fused, [7], strong, first=1)[:6] == [10, 5, 20, 7, 6, 30]
    assert strong_matches(matches, fused, share=0.5) == {10, 20, 40}
    assert strong_matches([], [1], share=0.5) == set()


def test_a_second_hop_goes_after_the_strong_matches_wherever_a_fusion_put_them() -> None:
    # lexical order: strong 10, 20; weak 30; the hop found 7, 8, 9 (two go first)
    assert with_hops([10, 20, 30], [7, 8, 9], {10, 20}, first=2) == [10, 20, 7, 8, 30, 9]
    # fused with an embedding's finds (5, 6): still right after the last strong one kept
    assert with_hops([5, 10, 6, 30, 20], [7, 8, 9], {10, 20}, first=2) == [
        5,
        10,
        6,
        30,
        20,
        7,
        8,
        9,
    ]
    assert with_hops([10, 5, 6, 30], [7, 8], {10, 20}, first=2) == [10, 7, 8, 5, 6, 30]
    # the fusion kept none of the strong: the hop's finds go last
    assert with_hops([5, 6], [7], {10}, first=2) == [5, 6, 7]
