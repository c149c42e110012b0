"""Plans: what a compaction keeps, drops and prunes - and the engine every strategy shares.

A strategy only *ranks* units (``Ranking``: which to drop unconditionally, then
in which order); the engine here enforces the invariants once, for all of them:

* the view is repaired first (orphans left out, unanswered calls answered), so
  every plan yields a provider-valid view;
* units are kept or dropped whole;
* protected units are never dropped: system messages (``preserve_system``),
  units holding a ``critical`` item, the unit of the last user message and the
  unit of the last human turn (the request being answered);
* critical items are never pruned; system messages are never changed;
* a summary (``kind="summary"``) stands for many turns, so - decision - it is
  dropped only after every other droppable unit, whatever the strategy;
* the result fits ``target_tokens``. If the protected core alone exceeds the
  target: when the whole view still fits ``budget_tokens`` nothing is deleted
  (one warning); otherwise everything droppable goes until the view fits the
  budget (one warning); if the core exceeds the budget, ``CompactionError``
  (``NO_TOKEN_BUDGET``) says by how much. ``budget_tokens`` defaults to
  ``target_tokens``, so a plain call raises when the core exceeds the target.

Order of work once the view is over target: prune long tool outputs, drop
duplicate messages, then drop units in the strategy's order. Planning is
O(n log n); the input items are never modified.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from contextledger.core.compaction.dedupe import duplicate_refs
from contextledger.core.compaction.prune import prune_tool_outputs
from contextledger.core.config import ContextConfig
from contextledger.core.tokens import TokenCounter
from contextledger.core.units import Unit, group_units, is_human_turn, repair, unit_index
from contextledger.core.view import Ref, ViewItem
from contextledger.errors import CompactionError, InvalidArgument


@dataclass(frozen=True, slots=True)
class Plan:
    """The outcome of a compaction decision; ``apply_plan`` turns it into items.

    ``keep`` lists the refs of the resulting view in order (synthetic results
    included); ``drop`` the refs left out (orphans, duplicates, dropped units) in
    view order; ``prune`` maps a kept ref to its replacement message;
    ``summarize`` is filled only by the summarize strategy: the contiguous range a
    summarizer should fold (the keep/drop part is then the deterministic fallback).
    """

    strategy: str
    keep: tuple[Ref, ...]
    drop: tuple[Ref, ...] = ()
    prune: Mapping[Ref, Mapping[str, Any]] = field(default_factory=lambda: MappingProxyType({}))
    synthetic: tuple[ViewItem, ...] = ()
    summarize: tuple[Ref, ...] = ()
    tokens_before: int = 0
    tokens_after: int = 0
    warnings: tuple[str, ...] = ()

    @property
    def changed(self) -> bool:
        return bool(self.drop or self.prune or self.synthetic)


def apply_plan(
    items: Sequence[ViewItem], plan: Plan, counter: TokenCounter
) -> tuple[ViewItem, ...]:
    """The view a plan describes; pruned items get the new message and a recount."""
    by_ref = {item.ref: item for item in items}
    for item in plan.synthetic:
        by_ref[item.ref] = item
    out: list[ViewItem] = []
    for ref in plan.keep:
        found = by_ref.get(ref)
        if found is None:
            raise InvalidArgument(f"plan keeps {ref}, which is not in the view", ref=ref)
        message = plan.prune.get(ref)
        if message is not None:
            found = replace(found, message=message, tokens=counter.count_message(message))
        out.append(found)
    return tuple(out)


# --------------------------------------------------------------------------- layout


@dataclass(frozen=True, slots=True)
class Layout:
    """The view as strategies see it: repaired (and pruned) items grouped into units."""

    items: tuple[ViewItem, ...]
    units: tuple[Unit, ...]
    unit_tokens: tuple[int, ...]
    protected: tuple[bool, ...]
    #: index of the first unit of the recent window (last ``keep_recent`` non-system messages)
    recent_unit: int
    #: unit holding the first human turn (the anchor), if any
    anchor_unit: int | None
    config: ContextConfig
    counter: TokenCounter

    def members(self, k: int) -> tuple[ViewItem, ...]:
        unit = self.units[k]
        return self.items[unit.start : unit.stop]

    def is_summary(self, k: int) -> bool:
        return any(item.kind == "summary" for item in self.members(k))

    def is_system(self, k: int) -> bool:
        return any(item.role == "system" for item in self.members(k))


@dataclass(frozen=True, slots=True)
class Ranking:
    """A strategy's answer: units to drop outright, then the order to drop more in."""

    forced: tuple[int, ...] = ()
    order: tuple[int, ...] = ()


Ranker = Callable[[Layout], Ranking]


def _recent_unit(
    items: Sequence[ViewItem], units: Sequence[Unit], owner: Sequence[int], n: int
) -> int:
    """First unit of the window holding the last ``n`` non-system messages (unit-aligned)."""
    seen = 0
    for pos in range(len(items) - 1, -1, -1):
        if items[pos].role == "system":
            continue
        seen += 1
        if seen >= n:
            return owner[pos]
    return 0


def _protected(
    items: Sequence[ViewItem], units: Sequence[Unit], owner: Sequence[int], config: ContextConfig
) -> list[bool]:
    protected = [False] * len(units)
    last_user: int | None = None
    last_human: int | None = None
    for pos, item in enumerate(items):
        if item.critical or (config.preserve_system and item.role == "system"):
            protected[owner[pos]] = True
        if item.role == "user":
            last_user = pos
            if is_human_turn(item.message):
                last_human = pos
    for last in (last_user, last_human):
        if last is not None:
            protected[owner[last]] = True
    return protected


def _no_budget(core: int, budget: int, target: int) -> CompactionError:
    return CompactionError(
        f"system, critical and last-user messages need {core} tokens, "
        f"{core - budget} more than the budget of {budget}",
        code="NO_TOKEN_BUDGET",
        core_tokens=core,
        budget_tokens=budget,
        target_tokens=target,
        over_by=core - budget,
    )


def run(
    items: Sequence[ViewItem],
    *,
    target_tokens: int,
    budget_tokens: int | None,
    config: ContextConfig,
    counter: TokenCounter,
    strategy: str,
    ranker: Ranker,
) -> Plan:
    """Plan with ``ranker`` under the shared invariants (see the module docstring)."""

    budget = target_tokens if budget_tokens is None else budget_tokens
    if target_tokens <= 0:
        raise InvalidArgument(
            f"target_tokens must be > 0, got {target_tokens}", key="target_tokens"
        )
    if budget < target_tokens:
        raise InvalidArgument(
            f"budget_tokens ({budget}) must not be below target_tokens ({target_tokens})",
            key="budget_tokens",
        )
    tokens_before = sum(item.tokens for item in items)
    repaired = repair(items, counter=counter)
    work = repaired.items
    left_out = set(repaired.left_out)
    total = sum(item.tokens for item in work)

    def finish(
        drop: set[Ref],
        prune: Mapping[Ref, Mapping[str, Any]],
        tokens: Mapping[Ref, int],
        warnings: list[str],
    ) -> Plan:
        keep = tuple(item.ref for item in work if item.ref not in drop)
        dropped = tuple(item.ref for item in items if item.ref in drop or item.ref in left_out)
        after = sum(tokens.get(item.ref, item.tokens) for item in work if item.ref not in drop)
        return Plan(
            strategy=strategy,
            keep=keep,
            drop=dropped,
            prune=MappingProxyType(dict(prune)),
            synthetic=repaired.synthetic,
            tokens_before=tokens_before,
            tokens_after=after,
            warnings=tuple(warnings),
        )

    if total <= target_tokens:
        return finish(set(), {}, {}, [])

    units = group_units(work)
    owner = unit_index(units, len(work))
    protected = _protected(work, units, owner, config)
    core_raw = sum(work[p].tokens for p in range(len(work)) if protected[owner[p]])
    warnings: list[str] = []
    if core_raw > target_tokens and total <= budget:
        warnings.append(
            f"protected messages need {core_raw} tokens, more than the target of {target_tokens}; "
            f"the view ({total} tokens) still fits the budget of {budget}, nothing was removed"
        )
        return finish(set(), {}, {}, warnings)

    # 1. prune long tool outputs (never critical ones, never protected tools / recent results)
    prune = prune_tool_outputs(work, config=config, counter=counter)
    tokens: dict[Ref, int] = {}
    for ref, message in prune.items():
        tokens[ref] = counter.count_message(message)
    pruned_items = tuple(
        replace(item, message=prune[item.ref], tokens=tokens[item.ref])
        if item.ref in prune
        else item
        for item in work
    )
    unit_tokens = [0] * len(units)
    for pos, item in enumerate(pruned_items):
        unit_tokens[owner[pos]] += item.tokens
    core = sum(t for k, t in enumerate(unit_tokens) if protected[k])
    if core > budget:
        raise _no_budget(core, budget, target_tokens)
    limit = target_tokens
    if core > target_tokens:
        limit = budget
        warnings.append(
            f"protected messages need {core} tokens, more than the target of {target_tokens}; "
            f"compacted to the budget of {budget} instead"
        )
    total = sum(unit_tokens)
    drop: set[Ref] = set()
    if total <= limit:
        return finish(drop, prune, tokens, warnings)

    # 2. drop duplicates of later identical messages
    dropped_units = [False] * len(units)
    duplicates: list[int] = []
    position = {item.ref: pos for pos, item in enumerate(pruned_items)}
    floor = _recent_unit(pruned_items, units, owner, config.keep_recent)
    for ref in duplicate_refs(pruned_items):
        k = owner[position[ref]]
        if protected[k] or dropped_units[k] or k >= floor:
            continue
        dropped_units[k] = True
        duplicates.append(k)
        total -= unit_tokens[k]
    forced: list[int] = []
    dropped_in_order: list[int] = []
    summaries: list[int] = []
    if total > limit:
        # 3. the strategy's order; summaries last, protected never
        layout = Layout(
            items=pruned_items,
            units=units,
            unit_tokens=tuple(unit_tokens),
            protected=tuple(protected),
            recent_unit=floor,
            anchor_unit=next(
                (owner[p] for p, item in enumerate(pruned_items) if is_human_turn(item.message)),
                None,
            ),
            config=config,
            counter=counter,
        )
        ranking = ranker(layout)
        summaries[:] = [k for k in range(len(units)) if layout.is_summary(k)]
        summary_set = set(summaries)
        for k in ranking.forced:
            if not protected[k] and not dropped_units[k] and k not in summary_set:
                dropped_units[k] = True
                forced.append(k)
                total -= unit_tokens[k]
        order = [k for k in ranking.order if k not in summary_set]
        seen = set(order)
        order += [k for k in range(len(units)) if k not in seen and k not in summary_set]
        for k in order:
            if total <= limit:
                break
            if protected[k] or dropped_units[k] or k >= floor:
                continue
            dropped_units[k] = True
            dropped_in_order.append(k)
            total -= unit_tokens[k]
        # the recent window is a floor: it gives way only to fit the budget, oldest first;
        # summaries (each stands for many turns) go only after it
        for k in (*(k for k in range(floor, len(units)) if k not in summary_set), *summaries):
            if total <= budget:
                break
            if protected[k] or dropped_units[k]:
                continue
            dropped_units[k] = True
            total -= unit_tokens[k]
    # 4. fill up to the limit again: the last units dropped first (newest-first for
    # truncate), then the strategy's forced drops, then duplicates, newest first. A
    # summary that gave way to the budget comes back first, and while one stays out
    # nothing else does: it stands for more turns than any unit it would make room for
    for k in reversed(summaries):
        if dropped_units[k] and total + unit_tokens[k] <= limit:
            dropped_units[k] = False
            total += unit_tokens[k]
    refill = (*reversed(dropped_in_order), *reversed(forced), *reversed(duplicates))
    for k in () if any(dropped_units[k] for k in summaries) else refill:
        if k < floor and dropped_units[k] and total + unit_tokens[k] <= limit:
            dropped_units[k] = False
            total += unit_tokens[k]
    if total > budget:  # cannot happen: core <= budget and everything else is droppable
        raise _no_budget(total, budget, target_tokens)
    if total > limit:
        warnings.append(
            f"the last {config.keep_recent} messages (keep_recent) need {total} tokens with "
            f"what must stay, more than the target of {limit}; kept within the budget of {budget}"
        )
    for k, unit in enumerate(units):
        if dropped_units[k]:
            drop.update(item.ref for item in work[unit.start : unit.stop])
    prune = {ref: m for ref, m in prune.items() if ref not in drop}
    return finish(drop, prune, tokens, warnings)


__all__ = [
    "Layout",
    "Plan",
    "Ranker",
    "Ranking",
    "apply_plan",
    "run",
]
