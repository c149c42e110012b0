"""Every strategy keeps every invariant, on random views of both provider shapes."""

from __future__ import annotations

import copy
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contextledger.core.compaction import Plan, apply_plan, plan
from contextledger.core.compaction.prune import is_pruned
from contextledger.core.config import ContextConfig
from contextledger.core.units import group_units, is_human_turn, provider_valid, repair
from contextledger.core.view import ViewItem
from contextledger.errors import CompactionError
from tests.examples import examples
from tests.unit.strategies import COUNTER, STRATEGY_NAMES, configs, conversations


def protected_core(view: Sequence[ViewItem], config: ContextConfig) -> tuple[set[int], list[int]]:
    """Oracle: positions (in the repaired view) of the protected units, and unit spans."""
    fixed = repair(view, counter=COUNTER).items
    units = group_units(fixed)
    last_user = max((p for p, i in enumerate(fixed) if i.role == "user"), default=None)
    last_human = max((p for p, i in enumerate(fixed) if is_human_turn(i.message)), default=None)
    core: set[int] = set()
    for unit in units:
        members = range(unit.start, unit.stop)
        if any(
            fixed[p].critical
            or (config.preserve_system and fixed[p].role == "system")
            or p in (last_user, last_human)
            for p in members
        ):
            core.update(members)
    return core, [u.start for u in units]


def assert_plan_invariants(
    view: tuple[ViewItem, ...],
    decided: Plan,
    result: tuple[ViewItem, ...],
    *,
    target: int,
    budget: int,
    config: ContextConfig,
) -> None:
    fixed = repair(view, counter=COUNTER)
    by_ref = {i.ref: i for i in fixed.items}
    # a provider would accept it
    assert provider_valid(m.message for m in result) == []
    # keep and drop partition the view; the order is the view's
    input_refs = [i.ref for i in view]
    assert set(decided.keep) | set(decided.drop) >= set(input_refs)
    assert not set(decided.keep) & set(decided.drop)
    assert [i.ref for i in result] == list(decided.keep)
    assert [r for r in decided.keep if r in set(input_refs)] == [
        r for r in input_refs if r in set(decided.keep)
    ]
    # budgets respected, tokens reported truthfully
    assert decided.tokens_before == sum(i.tokens for i in view)
    assert decided.tokens_after == sum(i.tokens for i in result)
    if decided.tokens_after > target:
        assert len(decided.warnings) >= 1
        assert decided.tokens_after <= budget or not (set(decided.drop) - set(fixed.left_out))
    # units never split: in the repaired view each unit is kept or dropped whole
    keep = set(decided.keep)
    for unit in group_units(fixed.items):
        kept = {fixed.items[p].ref in keep for p in range(unit.start, unit.stop)}
        assert len(kept) == 1
    # protected core: system (unchanged, order kept), critical (never pruned), last user
    core, _ = protected_core(view, config)
    for p in core:
        assert fixed.items[p].ref in keep
    result_by_ref = {i.ref: i for i in result}
    for item in fixed.items:
        if (item.critical or item.role == "system") and item.ref in result_by_ref:
            assert result_by_ref[item.ref].message == item.message
    if config.preserve_system:
        leading = 0
        while leading < len(view) and view[leading].role == "system":
            leading += 1
        assert [i.ref for i in result[:leading]] == [i.ref for i in view[:leading]]
    # pruned items: marked, smaller, never critical
    for ref, message in decided.prune.items():
        original = by_ref[ref]
        assert not original.critical
        assert result_by_ref[ref].tokens < original.tokens
        assert is_pruned(str(message.get("content")))
    # summaries go only after every other droppable unit
    dropped_summary = any(by_ref[r].kind == "summary" for r in decided.drop if r in by_ref)
    if dropped_summary:
        for p, item in enumerate(fixed.items):
            if item.ref in keep and item.kind != "summary":
                assert p in core, "a summary was dropped while a droppable unit was kept"


@settings(max_examples=examples(150), deadline=None)
@given(
    view=conversations(min_segments=2),
    config=configs(),
    strategy=st.sampled_from(STRATEGY_NAMES),
    fraction=st.floats(0.1, 1.1),
    slack=st.floats(1.0, 2.0),
)
def test_every_strategy_keeps_every_invariant(
    view: tuple[ViewItem, ...],
    config: ContextConfig,
    strategy: str,
    fraction: float,
    slack: float,
) -> None:
    total = sum(i.tokens for i in view)
    target = max(1, int(total * fraction))
    budget = int(target * slack)
    before = copy.deepcopy(view)
    try:
        decided = plan(
            view,
            target_tokens=target,
            budget_tokens=budget,
            config=config,
            counter=COUNTER,
            strategy=strategy,
        )
    except CompactionError as exc:
        assert exc.code == "NO_TOKEN_BUDGET"
        assert view == before
        # the protected core alone is over budget (an oracle lower bound: items never pruned)
        core, _ = protected_core(view, config)
        fixed = repair(view, counter=COUNTER).items
        unpruned = sum(
            fixed[p].tokens
            for p in core
            if fixed[p].critical
            or (
                fixed[p].role != "tool"
                and not fixed[p].message.get("tool_calls")
                and not isinstance(fixed[p].message.get("content"), list)
            )
        )
        assert exc.details["core_tokens"] > budget
        assert exc.details["over_by"] == exc.details["core_tokens"] - budget
        assert exc.details["core_tokens"] >= unpruned
        assert sum(fixed[p].tokens for p in core) > budget
        return
    assert view == before, "planning must not touch the history"
    result = apply_plan(view, decided, COUNTER)
    assert view == before
    assert_plan_invariants(view, decided, result, target=target, budget=budget, config=config)
    if strategy == "summarize":
        assert decided.strategy == "summarize"


@pytest.mark.parametrize("strategy", STRATEGY_NAMES)
def test_a_view_within_target_is_left_alone(strategy: str) -> None:
    from tests.unit.strategies import assistant, items, system, user

    view = items([system("be brief"), user("hi"), assistant("hello"), user("bye")])
    decided = plan(
        view,
        target_tokens=sum(i.tokens for i in view),
        config=ContextConfig(),
        counter=COUNTER,
        strategy=strategy,
    )
    assert decided.keep == tuple(i.ref for i in view)
    assert decided.drop == () and not decided.prune and not decided.changed
