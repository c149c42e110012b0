"""The strategy registry and ``plan``: a strategy name -> its ranker -> the one engine.

Each ranker module holds only its ranking; ``engine.run`` enforces the invariants
every strategy keeps. ``summarize`` needs a model, which pure code cannot call: its
plan carries the range to fold plus a ``truncate`` plan as the deterministic fallback.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from types import MappingProxyType

from contextledger.core.compaction.engine import Plan, Ranker, run
from contextledger.core.compaction.importance import importance_ranking
from contextledger.core.compaction.priority import priority_ranking
from contextledger.core.compaction.select import select_for_summary
from contextledger.core.compaction.truncate import truncate_ranking
from contextledger.core.config import STRATEGIES, ContextConfig
from contextledger.core.tokens import TokenCounter
from contextledger.core.view import ViewItem
from contextledger.errors import InvalidArgument

#: Rankers by strategy name; ``summarize`` ranks like ``truncate`` for its fallback.
RANKERS: Mapping[str, Ranker] = MappingProxyType(
    {"truncate": truncate_ranking, "priority": priority_ranking, "importance": importance_ranking}
)


def plan(
    items: Sequence[ViewItem],
    *,
    target_tokens: int,
    config: ContextConfig,
    counter: TokenCounter,
    budget_tokens: int | None = None,
    strategy: str | None = None,
) -> Plan:
    """Plan a compaction of ``items`` down to ``target_tokens`` (hard limit ``budget_tokens``).

    ``strategy`` defaults to ``config.compaction_strategy``. ``summarize`` needs a
    model, which pure code cannot call: its plan carries the range to fold in
    ``summarize`` and a ``truncate`` plan as the deterministic fallback.
    """
    name = strategy or config.compaction_strategy
    if name == "summarize":
        fallback = run(
            items,
            target_tokens=target_tokens,
            budget_tokens=budget_tokens,
            config=config,
            counter=counter,
            strategy="summarize",
            ranker=truncate_ranking,
        )
        s = config.summarizer
        selection = select_for_summary(
            items,
            preserve_recent_turns=s.preserve_recent_turns,
            preserve_tokens=s.preserve_tokens,
            min_messages=s.min_messages,
        )
        return replace(
            fallback,
            summarize=selection or (),
            warnings=(
                *fallback.warnings,
                "summarize: keep/drop is the deterministic truncate fallback",
            ),
        )
    ranker = RANKERS.get(name)
    if ranker is None:
        raise InvalidArgument(
            f"unknown compaction strategy {name!r} (known: {', '.join(STRATEGIES)})",
            key="strategy",
        )
    return run(
        items,
        target_tokens=target_tokens,
        budget_tokens=budget_tokens,
        config=config,
        counter=counter,
        strategy=name,
        ranker=ranker,
    )
