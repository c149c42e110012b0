"""The request planner: what the next request carries, updated message by message.

A request view is the pinned items (system, critical, summaries, the last human
turn's unit) followed by the view's tail from a *cut*. The cut is a pure
function of the view and the budget, so a replay (``Session.request_at``)
recomputes exactly what a live request carried, and it moves rarely, so the
prompt prefix (and the provider's prompt cache) stays put:

* the view's cumulative token count is divided into cells of
  ``(compact_threshold - compact_target) x budget`` tokens; a *boundary* is the
  first unit start in a cell (tool units are never split);
* the cut is the earliest boundary at which the request fits under
  ``compact_threshold x budget`` (the trigger), never past the recent window
  (the last ``keep_recent`` non-system messages, a floor).

As messages arrive the served tokens grow from about ``compact_target x budget``
to the trigger, then the cut jumps one cell: the fill stays between the target
and the trigger, and the prefix changes once per cell of new tokens (the
hysteresis that keeps compaction storms and cache busting away). Each message
costs O(1) amortized; the planner holds only the served items plus what is newer
(O(budget), not O(history)). Should the floor or the pinned items alone exceed
the budget, the engine fits them (``plan``), which raises ``NO_TOKEN_BUDGET``
when even the protected core cannot fit.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Sequence

from contextledger.core.compaction.engine import apply_plan
from contextledger.core.compaction.strategies import plan
from contextledger.core.config import ContextConfig
from contextledger.core.tokens import TokenCounter
from contextledger.core.units import is_human_turn, repair, result_ids, tool_calls
from contextledger.core.view import ViewItem
from contextledger.errors import InvalidArgument

#: Items the cut passed that are kept for a summarizer, at most this many budgets of tokens.
DROPPED_KEPT_BUDGETS = 1


def thresholds(
    budget_tokens: int, config: ContextConfig, whole_tokens: int | None = None
) -> tuple[int, int, int]:
    """``(budget, trigger, target)`` in tokens; ``max_tokens`` caps the budget.

    ``whole_tokens`` is the request's whole budget when the view gets only part of it
    (``budget_tokens``; recall's share is held back): ``compact_threshold`` and
    ``compact_target`` are then shares of the whole, the trigger capped at the view's
    part. A request whose recall block is empty still fills to the target (not to the
    target of the view's part: 0.6 x 0.85 = 0.51 with the defaults) and the hysteresis
    cell keeps its size. The target never passes the midpoint between the view's own
    target and the trigger, whatever the share.
    """
    if budget_tokens <= 0:
        raise InvalidArgument(
            f"budget_tokens must be > 0, got {budget_tokens}", key="budget_tokens"
        )
    budget = min(budget_tokens, config.max_tokens) if config.max_tokens else budget_tokens
    own = config.compact_target * budget
    if whole_tokens is None or whole_tokens <= budget:
        trigger = math.floor(config.compact_threshold * budget)
        return budget, trigger, max(1, math.floor(own))
    whole = min(whole_tokens, config.max_tokens) if config.max_tokens else whole_tokens
    trigger = min(budget, math.floor(config.compact_threshold * whole))
    wanted = min(max(own, config.compact_target * whole), (trigger + own) / 2)
    return budget, trigger, max(1, math.floor(wanted))


def is_pinned(item: ViewItem, config: ContextConfig) -> bool:
    """Served whatever the cut: critical items, summaries, system messages (preserve_system)."""
    if item.critical or item.kind == "summary":
        return True
    return config.preserve_system and item.role == "system"


def starts_unit(item: ViewItem) -> bool:
    """A cut may fall before this item: it is not a tool result (which stays with its call)."""
    return item.role != "tool" and not result_ids(item.message)


class RequestPlanner:
    """The request view of one budget and config, kept up to date as items are pushed.

    Feed it the view in order (``push``); ``view()`` is the request. A planner can
    start from the whole view or from a tail of it (``start``: the tokens of the view
    before the first item pushed, and the pinned items that lie before it).
    """

    def __init__(
        self,
        budget_tokens: int,
        config: ContextConfig,
        counter: TokenCounter,
        whole_tokens: int | None = None,
    ) -> None:
        self.budget, self.trigger, self.target = thresholds(budget_tokens, config, whole_tokens)
        self.budget_tokens = budget_tokens
        self.cell = max(1, self.trigger - self.target)
        self.config = config
        self.counter = counter
        self._off = 0  # absolute index of self._items[0]
        self._items: list[ViewItem] = []
        self._ustart: list[int] = []  # absolute index of the unit start of each held item
        self._end = 0  # tokens of the view so far (cumulative count after the last item)
        self._cut = 0  # absolute index where the served tail starts
        self._tail_tokens = 0
        self._pinned: list[ViewItem] = []  # pinned items before the cut
        self._pinned_tokens = 0
        self._anchor: list[ViewItem] = []  # the last human turn's unit, once the cut passed it
        self._anchor_start = -1
        self._anchor_tokens = 0
        self._recent: deque[int] = deque(maxlen=config.keep_recent)
        self._boundaries: deque[int] = deque()
        self._start_cell: int | None = None  # cell of the last unit start seen
        self._pending: set[str] = set()  # calls of the last call message not answered yet
        #: unit starts of units with an orphan result or an unanswered call, and the last one
        self._anomalies: set[int] = set()
        self._anomaly = -1
        self._call_start = -1
        self._dirty_prefix = False
        self._prefix: tuple[ViewItem, ...] | None = ()
        self.passes = 0
        #: items the cut passed (oldest first), for a summarizer; bounded by the budget
        self.dropped: deque[ViewItem] = deque()
        self._dropped_tokens = 0
        self.warnings: tuple[str, ...] = ()
        #: the last view needed the engine (over the budget): its prefix may move
        self.fitted = False

    # -- feeding -------------------------------------------------------------------

    def start(self, before_tokens: int, pinned: Iterable[ViewItem] = ()) -> None:
        """Begin mid-view: ``before_tokens`` precede the first item pushed; ``pinned`` are
        the pinned items among those (already in order)."""
        self._end = before_tokens
        for item in pinned:
            if is_human_turn(item.message) and not is_pinned(item, self.config):
                self._anchor = [item]
                self._anchor_tokens = item.tokens
            else:
                self._pinned.append(item)
                self._pinned_tokens += item.tokens
        self._prefix = None

    def push(self, item: ViewItem) -> None:
        """Add the view's next item (a persisted one: ephemeral items are merged by the caller)."""
        index = self._off + len(self._items)
        first_cell = self._end // self.cell
        self._end += item.tokens
        self._tail_tokens += item.tokens
        self._items.append(item)
        if starts_unit(item):
            self._ustart.append(index)
            if self._start_cell is not None and first_cell > self._start_cell:
                self._boundaries.append(index)
            self._start_cell = first_cell
            if self._pending:
                self._anomalies.add(self._call_start)  # a call left unanswered
                self._anomaly = max(self._anomaly, self._call_start)
            self._call_start = index
            self._pending = {c[0] for c in tool_calls(item.message)}
        else:
            self._ustart.append(self._ustart[-1] if self._ustart else index)
            answered = set(result_ids(item.message))
            if not answered <= self._pending:
                start = self._ustart[-1]  # an orphan result
                self._anomalies.add(start)
                self._anomaly = max(self._anomaly, start)
            self._pending -= answered
        if item.role != "system":
            self._recent.append(index)
        if is_human_turn(item.message):
            self._new_anchor(index)
        self._advance()

    def extend(self, items: Iterable[ViewItem]) -> None:
        for item in items:
            self.push(item)

    def _new_anchor(self, index: int) -> None:
        if self._anchor:
            for old in self._anchor:
                self._drop(old)
            self._anchor = []
            self._anchor_tokens = 0
            self._prefix = None
            self.passes += 1  # the request's prefix changed
        self._anchor_start = self._ustart[index - self._off]

    def _drop(self, item: ViewItem) -> None:
        self.dropped.append(item)
        self._dropped_tokens += item.tokens
        while self.dropped and self._dropped_tokens > DROPPED_KEPT_BUDGETS * self.budget:
            self._dropped_tokens -= self.dropped.popleft().tokens

    def _pass_unit(self, unit: list[ViewItem], start: int) -> None:
        """The cut passed ``unit``: it stays served (whole) if it holds a pinned item or
        is the last human turn's unit, else it leaves the request."""
        size = sum(i.tokens for i in unit)
        self._tail_tokens -= size
        if start in self._anomalies:
            self._anomalies.discard(start)
            if start == self._anchor_start or any(is_pinned(i, self.config) for i in unit):
                self._dirty_prefix = True
        if any(is_pinned(i, self.config) for i in unit):
            self._pinned.extend(unit)
            self._pinned_tokens += size
        elif start == self._anchor_start:
            self._anchor.extend(unit)
            self._anchor_tokens += size
        else:
            for item in unit:
                self._drop(item)

    def _limit(self) -> int:
        """The cut never passes the start of the recent window (the keep_recent floor)."""
        if len(self._recent) < self.config.keep_recent:
            return self._off
        return self._ustart[self._recent[0] - self._off]

    def _served_tokens(self) -> int:
        return self._pinned_tokens + self._anchor_tokens + self._tail_tokens

    def _advance(self) -> None:
        limit = self._limit()
        moved = False
        while self._boundaries and self._served_tokens() > self.trigger:
            j = self._boundaries[0]
            if j > limit:
                break
            self._boundaries.popleft()
            passed = self._items[self._cut - self._off : j - self._off]
            starts = self._ustart[self._cut - self._off : j - self._off]
            unit: list[ViewItem] = []
            for n, item in enumerate(passed):
                unit.append(item)
                if n + 1 == len(passed) or starts[n + 1] != starts[n]:
                    self._pass_unit(unit, starts[n])
                    unit = []
            self._cut = j
            moved = True
        if moved:
            self.passes += 1
            self._prefix = None
            if self._cut - self._off > 256 and self._cut - self._off > len(self._items) // 2:
                drop = self._cut - self._off
                del self._items[:drop]
                del self._ustart[:drop]
                self._off = self._cut

    # -- reading ---------------------------------------------------------------------

    @property
    def tokens(self) -> int:
        """Tokens of the request view before any fitting (pinned + tail)."""
        return self._served_tokens()

    @property
    def view_tokens(self) -> int:
        """Tokens of the whole view pushed so far (the cumulative count)."""
        return self._end

    @property
    def held(self) -> int:
        """Items the planner holds (served, newer, and the bounded ``dropped`` buffer)."""
        return len(self._items) + len(self._pinned) + len(self._anchor) + len(self.dropped)

    def last_items(self, n: int) -> list[ViewItem]:
        return self._items[-n:]

    def pinned_items(self) -> tuple[ViewItem, ...]:
        """Items before the cut the request keeps (pinned, and the last human turn)."""
        return self._prefix_items()

    def take_dropped(self) -> list[ViewItem]:
        out = list(self.dropped)
        self.dropped.clear()
        self._dropped_tokens = 0
        return out

    def _prefix_items(self) -> tuple[ViewItem, ...]:
        if self._prefix is None:
            self._prefix = tuple(sorted((*self._pinned, *self._anchor), key=lambda i: i.ord))
        return self._prefix

    def view(self, extra: Sequence[ViewItem] = ()) -> tuple[ViewItem, ...]:
        """The request: pinned items, then the tail from the cut; ``extra`` (ephemeral
        items) merged in by ``ord``. Fitted by the engine only if over the budget."""
        tail = self._items[self._cut - self._off :]
        items: Sequence[ViewItem] = (*self._prefix_items(), *tail)
        if extra:
            items = sorted((*items, *extra), key=lambda i: i.ord)
        fix = bool(extra) or self._dirty_prefix or self._anomaly >= self._cut
        if fix:
            items = repair(items, counter=self.counter).items
        total = _sum(items) if fix else self._served_tokens()
        if total > self.budget:
            decided = plan(
                items,
                target_tokens=self.target,
                budget_tokens=self.budget,
                config=self.config,
                counter=self.counter,
                strategy="truncate",
            )
            self.warnings, self.fitted = decided.warnings, True
            return apply_plan(items, decided, self.counter)
        self.warnings, self.fitted = (), False
        return tuple(items)


def _sum(items: Sequence[ViewItem]) -> int:
    return sum(i.tokens for i in items)


def plan_view(
    items: Sequence[ViewItem],
    *,
    budget_tokens: int,
    config: ContextConfig,
    counter: TokenCounter,
    extra: Sequence[ViewItem] = (),
    whole_tokens: int | None = None,
) -> tuple[ViewItem, ...]:
    """The request view for ``items`` (a whole view) at ``budget_tokens``: what a live
    session serves, recomputed from scratch (replay)."""
    planner = RequestPlanner(budget_tokens, config, counter, whole_tokens)
    planner.extend(items)
    return planner.view(extra)
