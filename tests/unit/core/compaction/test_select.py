"""What a summarizer should fold: contiguous, unit-aligned, before the preserved tail."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from contextledger.core.compaction import select_for_summary
from contextledger.core.units import group_units, is_human_turn
from contextledger.core.view import ViewItem
from tests.examples import examples
from tests.unit.strategies import (
    Spec,
    assistant,
    call_batch,
    conversations,
    items,
    system,
    user,
)


def chat(turns: int) -> list[dict[str, str]]:
    return [m for k in range(turns) for m in (user(f"q{k}"), assistant(f"a{k}"))]


def test_folds_everything_before_the_last_five_turns() -> None:
    view = items([system("s"), *chat(12)])
    chosen = select_for_summary(view, preserve_recent_turns=5)
    # 12 user/assistant pairs, the last 5 stay: pairs 0..6 (14 messages) are folded
    assert chosen == tuple(i.ref for i in view[1:15])
    assert is_human_turn(view[15].message)


def test_prior_summary_is_folded_again() -> None:
    view = items([system("s"), Spec(user("Summary: earlier"), kind="summary"), *chat(8)])
    chosen = select_for_summary(view, preserve_recent_turns=5)
    assert chosen is not None and chosen[0] == view[1].ref


def test_stops_at_the_nearest_critical_or_system_message() -> None:
    view = items([system("s"), *chat(3), Spec(user("keep me"), critical=True), *chat(9)])
    chosen = select_for_summary(view, preserve_recent_turns=5)
    assert chosen == tuple(i.ref for i in view[8:16])


def test_too_few_messages_gives_none() -> None:
    view = items([system("s"), *chat(6)])
    assert select_for_summary(view, preserve_recent_turns=5, min_messages=4) is None
    assert select_for_summary(view, preserve_recent_turns=5, min_messages=2) == (
        view[1].ref,
        view[2].ref,
    )
    assert select_for_summary(items(chat(3)), preserve_recent_turns=5) is None


def test_token_tail_never_splits_a_tool_unit() -> None:
    batch = call_batch(
        "openai", [("a", "grep"), ("b", "grep")], [("a", "x" * 400), ("b", "y" * 400)]
    )
    view = items([system("s"), *chat(4), *batch, user("done?")])
    # the last message plus part of the unit's results would reach the token amount
    tail_tokens = view[-1].tokens + view[-2].tokens
    chosen = select_for_summary(view, preserve_tokens=tail_tokens, min_messages=1)
    assert chosen == tuple(i.ref for i in view[1:9])  # the chat; the unit stays whole in the tail


def test_agent_loop_steps_count_as_turns() -> None:
    steps = [
        m for k in range(8) for m in call_batch("anthropic", [(f"c{k}", "run")], [(f"c{k}", "ok")])
    ]
    view = items([system("s"), user("do the task"), *steps])
    chosen = select_for_summary(view, preserve_recent_turns=3)
    # 8 steps after one human message: the last 3 steps (6 messages) stay
    assert chosen == tuple(i.ref for i in view[1:-6])


@settings(max_examples=examples(150), deadline=None)
@given(
    view=conversations(orphans=False),
    turns=st.integers(0, 6),
    use_tokens=st.booleans(),
    share=st.floats(0, 1),
    min_messages=st.integers(1, 6),
)
def test_selection_is_contiguous_unit_aligned_and_never_folds_system_or_critical(
    view: tuple[ViewItem, ...], turns: int, use_tokens: bool, share: float, min_messages: int
) -> None:
    preserve_tokens = int(sum(i.tokens for i in view) * share) if use_tokens else None
    chosen = select_for_summary(
        view,
        preserve_recent_turns=turns,
        preserve_tokens=preserve_tokens,
        min_messages=min_messages,
    )
    if chosen is None:
        return
    refs = [i.ref for i in view]
    start = refs.index(chosen[0])
    assert tuple(refs[start : start + len(chosen)]) == chosen
    picked = view[start : start + len(chosen)]
    assert not any(i.role == "system" or i.critical for i in picked)
    assert sum(1 for i in picked if i.kind != "summary") >= min_messages
    starts = {u.start for u in group_units(view)} | {len(view)}
    assert start in starts and start + len(chosen) in starts
    if preserve_tokens is not None:
        assert sum(i.tokens for i in view[start + len(chosen) :]) >= preserve_tokens or (
            start + len(chosen) == 0
        )
