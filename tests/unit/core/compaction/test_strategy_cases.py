"""Named cases: each one a way compaction has gone wrong somewhere before."""

from __future__ import annotations

import pytest

from contextledger.core.compaction import apply_plan, plan
from contextledger.core.compaction.importance import importance_scores
from contextledger.core.compaction.prune import marker
from contextledger.core.config import ContextConfig
from contextledger.core.units import provider_valid
from contextledger.core.view import ViewItem
from contextledger.errors import CompactionError
from tests.unit.strategies import (
    COUNTER,
    STRATEGY_NAMES,
    Spec,
    anthropic_call,
    anthropic_results,
    assistant,
    call_batch,
    items,
    openai_call,
    openai_result,
    system,
    user,
)


def tokens(view: tuple[ViewItem, ...] | list[ViewItem]) -> int:
    return sum(i.tokens for i in view)


def run(view: tuple[ViewItem, ...], target: int, strategy: str = "truncate", **cfg: object):  # type: ignore[no-untyped-def]
    config = ContextConfig.from_mapping(cfg)
    decided = plan(view, target_tokens=target, config=config, counter=COUNTER, strategy=strategy)
    result = apply_plan(view, decided, COUNTER)
    assert provider_valid(m.message for m in result) == []
    return decided, result


@pytest.mark.parametrize("shape", ["openai", "anthropic"])
def test_tool_pair_straddling_the_start_of_the_keep_window_is_kept_whole(shape: str) -> None:
    # keep_recent=3 counts [result b, assistant, user]: the window starts inside the unit
    batch = call_batch(shape, [("a", "grep"), ("b", "run")], [("a", "1"), ("b", "2")])  # type: ignore[arg-type]
    view = items([system("s"), user("old question"), assistant("old answer"), *batch,
                  assistant("so"), user("now")])  # fmt: skip
    expected = [view[0], *view[3:]]  # system + the whole unit + the window
    decided, result = run(view, tokens(expected), keep_recent=3)
    assert list(result) == expected
    assert decided.drop == (view[1].ref, view[2].ref)


@pytest.mark.parametrize("shape", ["openai", "anthropic"])
def test_tool_pair_just_before_the_keep_window_is_dropped_whole(shape: str) -> None:
    batch = call_batch(shape, [("a", "grep"), ("b", "run")], [("a", "1"), ("b", "2")])  # type: ignore[arg-type]
    view = items([system("s"), user("old"), *batch, assistant("so"), user("now"), assistant("ok")])
    expected = [view[0], *view[-3:]]
    decided, result = run(view, tokens(expected), keep_recent=3)
    assert list(result) == expected
    assert set(decided.drop) == {i.ref for i in view[1:5]}


@pytest.mark.parametrize("shape", ["openai", "anthropic"])
def test_three_pairs_followed_by_ten_messages(shape: str) -> None:
    pairs = [
        m
        for k in range(3)
        for m in call_batch(shape, [(f"c{k}", "read_file")], [(f"c{k}", f"file {k} " * 30)])  # type: ignore[arg-type]
    ]
    tail = [user(f"question {k}") if k % 2 == 0 else assistant(f"answer {k}") for k in range(10)]
    view = items([system("s"), user("start"), *pairs, *tail])
    expected = [view[0], *view[-10:]]
    decided, result = run(view, tokens(expected), keep_recent=10)
    assert list(result) == expected
    assert len(decided.drop) == 1 + 6


@pytest.mark.parametrize("strategy", STRATEGY_NAMES)
def test_one_assistant_with_six_tool_calls_is_one_unit(strategy: str) -> None:
    calls = [(f"t{k}", "grep") for k in range(6)]
    batch = call_batch("openai", calls, [(f"t{k}", f"hit {k} " * 20) for k in range(6)])
    view = items(
        [system("s"), user("find it " * 40), *batch, assistant("found " * 30), user("thanks")]
    )
    unit = {i.ref for i in view[2:9]}
    # a target that fits system + last user but not the unit forces a decision about it
    _decided, result = run(view, tokens([view[0], view[-1]]) + 5, strategy, keep_recent=3)
    kept = {i.ref for i in result} & unit
    assert kept in (set(), unit)


def test_identical_results_with_different_ids_are_both_kept() -> None:
    view = items(
        [
            system("s"),
            user("same words"),
            openai_call([("a", "grep"), ("b", "grep")]),
            openai_result("a", "identical"),
            openai_result("b", "identical"),
            user("same words"),
        ]
    )
    decided, result = run(view, tokens(view) - 1, keep_recent=5)
    refs = {i.ref for i in result}
    assert {view[3].ref, view[4].ref} <= refs
    assert decided.drop == (view[1].ref,)  # only the earlier duplicate of the user message


@pytest.mark.parametrize("shape", ["openai", "anthropic"])
def test_huge_early_tool_result_is_pruned_not_dropped(shape: str) -> None:
    big = "line of log output\n" * 3000  # 57,000 chars
    batch = call_batch(shape, [("r", "read_file")], [("r", big)])  # type: ignore[arg-type]
    recent = [m for k in range(4) for m in call_batch(shape, [(f"x{k}", "run")], [(f"x{k}", "ok")])]  # type: ignore[arg-type]
    view = items([system("s"), user("read the log"), *batch, *recent, user("and?")])
    decided, result = run(view, tokens(view) // 2, keep_recent=20, max_tool_output_chars=10_000)
    assert decided.drop == ()
    assert list(decided.prune) == [view[3].ref]
    new = decided.prune[view[3].ref]
    text = new["content"] if shape == "openai" else new["content"][0]["content"]
    head = big[:5000]
    assert text.startswith(head[: head.rfind("\n") + 1])
    removed = big[len(head[: head.rfind("\n") + 1]) :]
    assert text.endswith(marker(COUNTER.count_text(removed)))
    assert tokens(result) <= tokens(view) // 2
    # pruning twice changes nothing: the marker is recognised
    again, _ = run(tuple(result), tokens(result) - 1, keep_recent=20)
    assert view[3].ref not in again.prune


def test_protected_tools_and_recent_results_are_never_pruned() -> None:
    big = "y" * 20_000
    view = items(
        [
            user("go"),
            *call_batch("openai", [("s", "skill")], [("s", big)]),
            *call_batch("openai", [("m", "read_file")], [("m", big)]),
            *call_batch("openai", [("n", "read_file")], [("n", big)]),
            user("next"),
        ]
    )
    decided, _ = run(view, tokens(view) - 10, protect_recent_tool_results=1)
    assert set(decided.prune) == {view[4].ref}  # not the skill, not the last result


def test_system_prompt_larger_than_target_but_view_fits_budget() -> None:
    view = items([system("rules " * 400), user("hi"), assistant("hello"), user("go on")])
    config = ContextConfig()
    target = view[0].tokens // 2
    decided = plan(
        view, target_tokens=target, budget_tokens=tokens(view), config=config, counter=COUNTER
    )
    assert decided.drop == () and not decided.prune
    assert decided.keep == tuple(i.ref for i in view)
    assert len(decided.warnings) == 1


def test_core_over_budget_raises_no_token_budget_with_the_excess() -> None:
    view = items([system("rules " * 400), user("hi"), assistant("hello"), user("go on")])
    core = view[0].tokens + view[3].tokens
    with pytest.raises(CompactionError) as caught:
        plan(view, target_tokens=core - 7, config=ContextConfig(), counter=COUNTER)
    assert caught.value.code == "NO_TOKEN_BUDGET"
    assert caught.value.details["over_by"] == 7
    assert "7 more" in str(caught.value)


def test_core_over_target_but_within_budget_keeps_only_the_core() -> None:
    view = items([system("rules " * 400), user("hi " * 100), assistant("hello " * 100), user("go")])
    core = view[0].tokens + view[3].tokens
    decided = plan(
        view,
        target_tokens=core - 1,
        budget_tokens=core + 1,
        config=ContextConfig(),
        counter=COUNTER,
    )
    assert decided.keep == (view[0].ref, view[3].ref)
    assert decided.tokens_after == core and len(decided.warnings) == 1


@pytest.mark.parametrize("strategy", STRATEGY_NAMES)
def test_critical_and_last_user_survive_a_tiny_target(strategy: str) -> None:
    view = items(
        [
            system("s"),
            Spec(user("remember: the deploy key is in vault"), critical=True),
            *[user(f"chat {k} " * 10) for k in range(10)],
            anthropic_call([("a", "run")]),
            anthropic_results([("a", "out")], text="last words"),
        ]
    )
    core = view[0].tokens + view[1].tokens + view[-1].tokens + view[-2].tokens + view[-3].tokens
    _decided, result = run(view, core, strategy)
    refs = [i.ref for i in result]
    assert view[1].ref in refs and view[-1].ref in refs and view[-2].ref in refs
    assert view[-3].ref in refs  # the last human turn


@pytest.mark.parametrize("strategy", ["truncate", "priority", "importance"])
def test_summary_goes_only_after_everything_else(strategy: str) -> None:
    view = items(
        [
            system("s"),
            Spec(user("Summary: we chose PostgreSQL " * 5), kind="summary"),
            *[assistant(f"detail {k} " * 30) for k in range(6)],
            user("continue"),
        ]
    )
    without_details = [view[0], view[1], view[-1]]
    _, result = run(view, tokens(without_details), strategy, keep_recent=3)
    assert list(result) == without_details
    _, result = run(view, tokens(without_details) - 1, strategy, keep_recent=3)
    assert list(result) == [view[0], view[-1]]


def test_priority_keeps_the_anchor_and_tool_pairs_over_plain_chat() -> None:
    view = items(
        [
            system("s"),
            user("build me a parser"),
            assistant("plain chat " * 20),
            *call_batch("openai", [("a", "run")], [("a", "tests pass")]),
            assistant("more chat " * 20),
            user("now?"),
        ]
    )
    keep = [view[0], view[1], view[3], view[4], view[-1]]
    _decided, result = run(view, tokens(keep), "priority", keep_recent=1)
    assert list(result) == keep


def test_importance_drops_acknowledgements_and_keeps_referenced_messages() -> None:
    view = items(
        [
            system("s"),
            user("hello there"),
            assistant("ok"),
            assistant("The bug is in parse_args of config.py, it mishandles flags. " * 3),
            assistant("Here is a long explanation of something unrelated entirely. " * 3),
            user("hmm"),
            user("wait"),
            user("so how do we fix parse_args?"),
        ]
    )
    scores = importance_scores(view)
    # ack low, states a fact (parse_args, config.py) like a user would: high; plain long
    # reply medium
    assert scores[1:5] == [1.0, 0.2, 1.0, 0.6]
    keep = [view[0], view[1], view[3], *view[5:]]
    decided, result = run(view, tokens(keep), "importance", keep_recent=1)
    assert list(result) == keep
    assert decided.drop == (view[2].ref, view[4].ref)


def test_importance_scores_facts_the_assistant_states_like_the_users() -> None:
    view = items(
        [
            user("Heads up: orchard-api binds to 18443 on staging."),
            assistant("Done. I moved the rate limiter into src/net/bucket_311.py."),
            assistant("Finance approved $12,430 for the migration."),
            assistant("Sounds good, carrying on with the refactor now."),
            user("anything else?"),
        ]
    )
    scores = importance_scores(view)
    assert scores[:4] == [1.0, 1.0, 1.0, 0.2]


def test_truncate_drops_duplicates_before_anything_else() -> None:
    view = items([system("s"), user("status?"), assistant("long " * 50), user("status?")])
    decided, result = run(view, tokens(view) - 1, keep_recent=1)
    assert decided.drop == (view[1].ref,)
    assert list(result) == [view[0], view[2], view[3]]


def test_orphans_are_dropped_and_unanswered_calls_answered() -> None:
    view = items(
        [
            openai_result("ghost", "orphan"),
            user("go"),
            openai_call([("a", "run")]),
            user("next"),
        ]
    )
    decided, result = run(view, tokens(view) * 2)
    assert decided.drop == (view[0].ref,)
    assert len(decided.synthetic) == 1 and decided.synthetic[0] in result


@pytest.mark.parametrize("strategy", STRATEGY_NAMES)
def test_a_summary_dropped_for_the_budget_is_not_replaced_by_a_newer_small_unit(
    strategy: str,
) -> None:
    # found by the invariant property test: the summary gave way to the budget, then the
    # refill put back a newer unit its removal made room for
    view = items(
        [
            system("You are terse."),
            user("an old question"),
            Spec(assistant("summary of turns one to forty " * 6), kind="summary"),
            assistant("ok"),
            Spec(user("the latest question"), critical=True),
        ]
    )
    sys_, old, summary, ok, latest = view
    target = sys_.tokens + latest.tokens + ok.tokens + 1
    assert summary.tokens > ok.tokens + 1
    _, result = run(view, target, strategy, keep_recent=1)
    kept = {i.ref for i in result}
    assert summary.ref not in kept  # it cannot fit
    assert ok.ref not in kept and old.ref not in kept  # and nothing takes its place
    assert kept == {sys_.ref, latest.ref}
