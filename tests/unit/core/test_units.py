"""Units (tool pairs kept whole) and repair (what a provider would accept)."""

from __future__ import annotations

import copy

from hypothesis import given, settings

from contextledger.core.units import (
    NO_RESULT_TEXT,
    group_units,
    provider_valid,
    repair,
    result_ids,
    tool_calls,
)
from tests.examples import examples
from tests.unit.strategies import (
    COUNTER,
    anthropic_call,
    anthropic_results,
    assistant,
    conversations,
    items,
    openai_call,
    openai_result,
    system,
    user,
)


def spans(view: tuple[object, ...]) -> list[tuple[int, int]]:
    return [(u.start, u.stop) for u in group_units(view)]  # type: ignore[arg-type]


def test_shapes_are_recognised() -> None:
    oa = openai_call([("a", "grep"), ("b", "run")])
    an = anthropic_call([("c", "skill")], text="let me look")
    assert tool_calls(oa) == (("a", "grep"), ("b", "run"))
    assert tool_calls(an) == (("c", "skill"),)
    assert result_ids(openai_result("a", "x")) == ("a",)
    assert result_ids(anthropic_results([("c", "x"), ("d", "y")], text="and")) == ("c", "d")
    assert result_ids(user("plain")) == ()
    assert result_ids({"role": "tool", "content": "no id"}) == ("",)


def test_openai_unit_spans_all_results_of_several_calls() -> None:
    view = items(
        [
            user("go"),
            openai_call([("a", "grep"), ("b", "run"), ("c", "read_file")]),
            openai_result("b", "2"),
            openai_result("a", "1"),
            openai_result("c", "3"),
            assistant("done"),
        ]
    )
    assert spans(view) == [(0, 1), (1, 5), (5, 6)]
    assert group_units(view)[1].missing == ()


def test_anthropic_results_spread_over_several_messages_form_one_unit() -> None:
    view = items(
        [
            anthropic_call([("a", "grep"), ("b", "run")]),
            anthropic_results([("a", "1")]),
            anthropic_results([("b", "2")], text="and a note"),
            user("next"),
        ]
    )
    assert spans(view) == [(0, 3), (3, 4)]
    assert provider_valid(m.message for m in view) == []


def test_result_after_another_message_is_an_orphan_and_the_call_gets_a_synthetic() -> None:
    view = items(
        [
            openai_call([("a", "grep"), ("b", "run")]),
            openai_result("a", "1"),
            user("meanwhile"),
            openai_result("b", "late"),
            assistant("ok"),
        ]
    )
    units = group_units(view)
    assert [(u.start, u.stop, u.orphan) for u in units] == [
        (0, 2, False),
        (2, 3, False),
        (3, 4, True),
        (4, 5, False),
    ]
    assert units[0].missing == ("b",)
    assert provider_valid(m.message for m in view) != []
    fixed = repair(view, counter=COUNTER)
    assert fixed.left_out == (view[3].ref,)
    assert [i.ref for i in fixed.items[:2]] == [view[0].ref, view[1].ref]
    synthetic = fixed.items[2]
    assert synthetic in fixed.synthetic and synthetic.kind == "synthetic"
    assert synthetic.message == {
        "role": "tool",
        "tool_call_id": "b",
        "content": NO_RESULT_TEXT,
        "name": "run",
    }
    assert synthetic.tokens == COUNTER.count_message(synthetic.message)
    assert view[1].ord < synthetic.ord < view[2].ord
    assert provider_valid(m.message for m in fixed.items) == []


def test_anthropic_synthetic_result_is_an_error_block_after_existing_results() -> None:
    view = items(
        [
            anthropic_call([("a", "grep"), ("b", "run"), ("c", "run")]),
            anthropic_results([("b", "2")]),
            user("next question"),
        ]
    )
    fixed = repair(view)
    assert [i.ref for i in fixed.items][:2] == [view[0].ref, view[1].ref]
    made = fixed.items[2]
    assert made.message["role"] == "user"
    assert [(b["tool_use_id"], b["is_error"]) for b in made.message["content"]] == [
        ("a", True),
        ("c", True),
    ]
    assert fixed.items[3] is view[2]
    assert provider_valid(m.message for m in fixed.items) == []


def test_unanswered_call_at_the_tail_is_work_in_progress() -> None:
    view = items([user("go"), openai_call([("a", "run")])])
    fixed = repair(view)
    assert fixed.items == view and not fixed.changed
    assert provider_valid(m.message for m in view) == []


def test_tail_start_marks_later_calls_as_in_progress() -> None:
    view = items([user("go"), openai_call([("a", "run")]), system("ephemeral notice")])
    assert repair(view).synthetic != ()
    assert repair(view, tail_start=1).synthetic == ()


def test_repair_is_deterministic_and_idempotent() -> None:
    view = items([openai_call([("a", "run")]), user("x"), openai_result("zz", "orphan")])
    first, second = repair(view), repair(view)
    assert first == second
    again = repair(first.items)
    assert again.items == first.items and not again.changed


def test_identical_results_with_different_ids_stay_separate() -> None:
    view = items(
        [
            openai_call([("a", "grep"), ("b", "grep")]),
            openai_result("a", "same"),
            openai_result("b", "same"),
        ]
    )
    assert spans(view) == [(0, 3)]
    assert repair(view).items == view


def test_duplicate_result_for_one_id_is_left_out() -> None:
    view = items(
        [
            openai_call([("a", "grep")]),
            openai_result("a", "1"),
            openai_result("a", "1 again"),
            user("x"),
        ]
    )
    fixed = repair(view)
    assert fixed.left_out == (view[2].ref,)
    assert provider_valid(m.message for m in fixed.items) == []


def test_provider_valid_names_the_violations() -> None:
    assert provider_valid([openai_result("x", "1")]) != []
    assert provider_valid([openai_call([("a", "run")]), user("hi")]) != []
    assert provider_valid([openai_call([("a", "run")]), openai_result("a", "1"), user("hi")]) == []
    assert provider_valid(
        [anthropic_call([("a", "run")]), system("s"), anthropic_results([("a", "1")])]
    )


@settings(max_examples=examples(150), deadline=None)
@given(conversations())
def test_repair_always_yields_a_valid_view_and_keeps_every_non_orphan(view: tuple) -> None:  # type: ignore[type-arg]
    before = copy.deepcopy(view)
    fixed = repair(view, counter=COUNTER)
    assert view == before
    assert provider_valid(m.message for m in fixed.items) == []
    kept = [i.ref for i in fixed.items if i.kind != "synthetic"]
    assert kept == [i.ref for i in view if i.ref not in set(fixed.left_out)]
    assert set(fixed.left_out) <= {i.ref for i in view}
    for left in fixed.left_out:
        item = next(i for i in view if i.ref == left)
        assert result_ids(item.message)
    refs = [i.ref for i in fixed.items]
    assert len(refs) == len(set(refs))
    assert repair(fixed.items).changed is False
