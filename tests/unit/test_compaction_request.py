"""The request planner: hysteresis (no compaction storm) and a stable prefix."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contextledger.compaction import RequestState, plan_request
from contextledger.config import ContextConfig
from contextledger.errors import CompactionError
from contextledger.units import provider_valid
from contextledger.view import ViewItem
from tests.unit.strategies import COUNTER, assistant, configs, conversations, items, system, user

STRATEGIES = ["truncate", "priority", "importance", "summarize"]


def steady(turns: int) -> tuple[ViewItem, ...]:
    messages = [system("You are a careful assistant.")]
    for k in range(turns):
        messages.append(user(f"question {k:04d}: " + "detail " * 12))
        messages.append(assistant(f"answer {k:04d}: " + "explanation " * 10))
    return items(messages)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_a_thousand_steady_turns_compact_rarely_and_keep_a_stable_prefix(strategy: str) -> None:
    view = steady(1000)
    budget = 4000
    config = ContextConfig.from_mapping({"compaction_strategy": strategy})
    trigger = math.floor(0.92 * budget)
    target = math.floor(0.6 * budget)
    turn = view[1].tokens + view[2].tokens  # every turn costs the same
    state: RequestState | None = None
    sent: tuple[ViewItem, ...] = ()
    for end in range(3, len(view) + 1, 2):  # one request per turn
        passes = state.passes if state else 0
        out, state = plan_request(
            view[:end], budget_tokens=budget, config=config, counter=COUNTER, previous=state
        )
        assert provider_valid(m.message for m in out) == []
        assert sum(i.tokens for i in out) <= trigger
        assert out[0] is view[0]
        if state.passes == passes:
            assert out[: len(sent)] == sent, "without a new pass the earlier view must not move"
        sent = out
    assert state is not None
    # after a pass the view is <= target; the next needs > trigger: >= gap // turn turns apart
    at_most = 1 + math.ceil(1000 / ((trigger - target) // turn))
    # a pass can leave at most the trigger, so at least this many are needed for 1000 turns
    at_least = math.floor((1000 * turn + view[0].tokens) / trigger) - 1
    assert at_least <= state.passes <= at_most
    assert state.passes < 1000 // 10


def test_below_the_threshold_nothing_changes_and_no_pass_is_counted() -> None:
    view = steady(5)
    out, state = plan_request(view, budget_tokens=10_000, config=ContextConfig(), counter=COUNTER)
    assert out == view and state.passes == 0


def test_max_tokens_caps_the_budget() -> None:
    view = steady(40)
    config = ContextConfig.from_mapping({"max_tokens": 1000})
    out, state = plan_request(view, budget_tokens=100_000, config=config, counter=COUNTER)
    assert state.passes == 1 and state.budget_tokens == 1000
    assert sum(i.tokens for i in out) <= 600


def test_a_changed_budget_starts_afresh() -> None:
    view = steady(60)
    config = ContextConfig()
    _, first = plan_request(view, budget_tokens=2000, config=config, counter=COUNTER)
    out, second = plan_request(
        view, budget_tokens=100_000, config=config, counter=COUNTER, previous=first
    )
    assert out == view and second.dropped == frozenset()


def test_a_stuck_core_waits_for_the_hard_budget_instead_of_storming() -> None:
    # the system prompt alone is above the trigger: every pass ends above it
    config = ContextConfig()
    big = system("policy " * 700)
    messages = [big]
    state: RequestState | None = None
    for k in range(40):
        messages += [user(f"q{k}"), assistant(f"a{k}")]
        view = items(messages)
        budget = view[0].tokens + 200
        try:
            out, state = plan_request(
                view, budget_tokens=budget, config=config, counter=COUNTER, previous=state
            )
        except CompactionError:
            pytest.fail("the core fits the budget")
        assert sum(i.tokens for i in out) <= budget
    assert state is not None
    # every message pair costs >= 10 tokens, 200 tokens of slack: passes come >= 10 turns apart
    assert 1 <= state.passes <= 40 // 10 + 1


@settings(max_examples=100, deadline=None)
@given(view=conversations(min_segments=5), config=configs(), fraction=st.floats(0.2, 1.0))
def test_random_sessions_stay_valid_within_budget_and_prefix_stable(
    view: tuple[ViewItem, ...], config: ContextConfig, fraction: float
) -> None:
    budget = max(1, int(sum(i.tokens for i in view) * fraction))
    state: RequestState | None = None
    sent: tuple[ViewItem, ...] = ()
    for end in range(1, len(view) + 1):
        passes = state.passes if state else 0
        try:
            out, state = plan_request(
                view[:end], budget_tokens=budget, config=config, counter=COUNTER, previous=state
            )
        except CompactionError as exc:
            assert exc.code == "NO_TOKEN_BUDGET"
            return
        assert provider_valid(m.message for m in out) == []
        assert sum(i.tokens for i in out) <= budget
        if state.passes == passes:
            assert out[: len(sent)] == sent
        sent = out
