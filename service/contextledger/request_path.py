"""The request path of one session: plan, fit, announce, summarize, recall, finish.

``RequestPath`` owns the request state a ``Session`` keeps between requests: the
planner (O(budget) items, ``core/compaction/request.py``), the raw budget it was
built for and the head whose events it has consumed. Every append keeps it in step
(``WritePath.append`` calls ``on_append`` or ``view_changed``), so a request reads
nothing when nothing changed, just the delta when another writer appended, and the
view's tail when the view was rewritten. ``replay`` rebuilds a past request from a
folded state with the same pure steps, so ``request_at`` gives it back exactly.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import structlog

from contextledger import hooks as hk
from contextledger.compactor import Compactor
from contextledger.core.budget import Budget, resolve_budget
from contextledger.core.compaction import RequestPlanner, plan_view
from contextledger.core.compaction.finish import (
    FinishCache,
    bridge_cost,
    bridge_reserve,
    finish_marked,
    finish_request_view,
    splice_safe,
)
from contextledger.core.config import ContextConfig
from contextledger.core.events import CheckpointCreated, MessageAppended, Payload
from contextledger.core.projection import ViewState, message_item
from contextledger.core.recall import (
    RecallBlock,
    anchor_of,
    block_item,
    latest_turn,
    leaves_out,
    query_end,
)
from contextledger.core.tokens import TokenCounter
from contextledger.core.units import tool_calls
from contextledger.core.view import ViewItem
from contextledger.errors import CompactionError
from contextledger.hooks import HookBus
from contextledger.protocols import LedgerHandle
from contextledger.recall import (
    announced,
    asks,
    carried_seqs,
    embed_backlog,
    embedding_key,
    extra_for,
    recall_block,
    reserve_for,
    search_for,
    with_recall,
)
from contextledger.session_state import SessionState
from contextledger.store.base import AppendResult, BranchMoved, Store

__all__ = ["RequestPath", "RequestingSession", "target_model"]

log = structlog.get_logger(__name__)


class TailCache(Protocol):
    """The write path's cached view tail, which a re-read of the ledger invalidates."""

    def forget_tail(self) -> None: ...


class RequestingSession(Protocol):
    """What the request path needs of its ``Session`` (a port: no import cycle)."""

    session_id: str
    counter: TokenCounter
    hooks: HookBus

    @property
    def model(self) -> str | None: ...
    def budget(self, token_budget: int | None = None, provider: Any | None = None) -> Budget: ...
    async def _follow(self) -> None: ...


def target_model(provider: Any | None, default: str | None) -> str | None:
    """The model a request goes to: the provider's, else the session's (``default``)."""
    for attr in ("default_model", "model"):
        value = getattr(provider, attr, None)
        if isinstance(value, str) and value:
            return value
    name = getattr(provider, "name", None)
    return name if isinstance(name, str) and name else default


@dataclass(slots=True)
class _Speculation:
    """A recall search started when the message that sets the next request's query was
    appended (``RequestPath.on_append``), for the view the planner then held."""

    task: asyncio.Future[RecallBlock]
    #: the view's items up to the query's last message, and what the search was given
    prefix: tuple[ViewItem, ...]
    anchor: int
    room: int
    config: ContextConfig


def _retrieved(task: asyncio.Future[RecallBlock]) -> None:
    """A speculation nobody awaits: its outcome is dropped (a request that needs the
    answer searches again), never reported as an unretrieved exception."""
    if not task.cancelled():
        task.exception()


def _calls_tools(payload: Payload) -> bool:
    return isinstance(payload, MessageAppended) and bool(tool_calls(payload.message))


#: The request path and seq of the request the running task built last: ``request_seq``
#: for the caller that built it, whatever other tasks built on the same handle since (the
#: service's clients share one). Set in the caller's own context (a request is awaited,
#: not run as a task of its own), so it is that task's alone.
BUILT_AT: contextvars.ContextVar[tuple[RequestPath, int] | None] = contextvars.ContextVar(
    "contextledger_built_at", default=None
)
#: Times a request is built again after its search found the branch replaced meanwhile
#: (each time another rollback landed during it); then the last try's ``BranchMoved``.
MAX_REBUILDS = 3


class RequestPath:
    """Request views for one ``Session``, with the planner state kept between them.

    Recall's search is anchored at the query's last message (``query_anchor``), so when
    that message is a tool call the search starts as it is appended, for the view the
    planner holds then, and runs while the tool does; the request after the results uses
    its answer when its own view agrees up to the call (same items, nothing older carried
    after it, same recall room and config): the same search, with the same answer. Not
    after a human turn: the request follows it at once, and on two cores a search beside
    the next append slowed the turn (1.6 -> 1.7-2.0 ms at 1,000-3,000 turns, bench/turns.py).
    """

    def __init__(
        self,
        session: RequestingSession,
        state: SessionState,
        compactor: Compactor,
        writes: TailCache,
    ) -> None:
        self._s = session
        self._state = state
        self._compactor = compactor
        self._writes = writes
        #: the planner (O(budget) items), the raw budget it was built for, and the head
        #: whose events it has consumed
        self.planner: RequestPlanner | None = None
        self._planner_budget = 0
        self._planned = 0
        #: the seq the last request view was built at
        self.request_seq = 0
        #: an append since the last request confirmed that nobody else moved the head
        self._checked = False
        #: the request's ``token_budget`` in force (auto-compaction and usage follow it)
        self.token_budget: int | None = None
        self._seen_passes = 0
        self._finished: FinishCache = {}
        #: the recall room of the last request (a speculation searches for that room)
        self._room = 0
        self._spec: _Speculation | None = None
        #: the hybrid engine's embedding of what requests left unembedded (one at a time)
        self._backlog: asyncio.Task[int] | None = None
        self._planning = asyncio.Lock()
        #: requests that used a speculation, and that searched afresh after one
        self.speculation_hits = 0
        self.speculation_misses = 0

    # -- what recall needs (``recall.RecallingSession``): this path stands for its session

    @property
    def session_id(self) -> str:
        """The session's id."""
        return self._state.session_id

    @property
    def counter(self) -> TokenCounter:
        """The session's token counter (a settings change may replace it)."""
        return self._s.counter

    @property
    def hooks(self) -> HookBus:
        """The session's hook bus (recall announces its block there)."""
        return self._s.hooks

    @property
    def store(self) -> Store:
        """The store the session reads and searches."""
        return self._state.store

    @property
    def ledger(self) -> LedgerHandle:
        """The ledger that opened the session (its in-process keys)."""
        return self._state.ledger

    def start_backlog(self, cfg: ContextConfig, upto_seq: int) -> None:
        """Embed what requests left unembedded up to ``upto_seq``, off the request path
        (``recall.embed_backlog``), unless that runs already; the ledger's close waits
        for it or cancels it."""
        if self._backlog is not None and not self._backlog.done():
            return
        key = embedding_key(self, cfg)
        work = embed_backlog(self.store, self.session_id, cfg.recall, key, upto_seq)
        self._backlog = asyncio.ensure_future(work)
        self._state.ledger.keep(self._backlog, resumable=True)

    # -- kept in step by the write path's appends ------------------------------------------

    def on_append(self, prior: int, result: AppendResult, payloads: Sequence[Payload]) -> None:
        """Messages (and checkpoints) this process appended after head ``prior``.

        The result's first seq says whether another writer moved the head since this
        process last saw it: if not, the new messages go straight into the planner; if
        so, the next request reads just the events in between (``_catch_up``).
        """
        moved = result.seqs[0] - 1 != prior
        planner = self.planner
        if planner is not None and not moved and self._planned == prior:
            for seq, payload in zip(result.seqs, payloads, strict=True):
                if isinstance(payload, MessageAppended):
                    planner.push(message_item(seq, payload))
            self._planned = result.seq
            if planner.view_tokens != result.view_tokens:  # out of step: read afresh
                self.planner = None
            elif _calls_tools(payloads[-1]):
                self._speculate(planner)
        self._checked = not moved

    def view_changed(self) -> None:
        """A cold-path event rewrote the view: the next request reloads the tail."""
        self.planner = None
        self._drop_speculation()

    def _speculate(self, planner: RequestPlanner) -> None:
        """Start the next request's recall search now (see the class docstring): at most
        one per session in flight, registered with the ledger (whose close waits for it);
        nothing here may fail the append that triggered it."""
        cfg = self._state.config
        room = self._room
        if not room or not self._state.store.concurrent_search or cfg.recall.engine == "hybrid":
            return
        previous, self._spec = self._spec, None
        if previous is not None and not previous.task.done():
            return  # calls appended faster than searches run: the requests search
        try:
            items = planner.view(self._state.ephemeral)
            end = query_end(items)
            at = latest_turn(items)
            if end is None or at is None or not splice_safe(items, at):
                return
            anchor = anchor_of(items, end, self._state.head)
            if anchor != items[end].ref[0] or carried_seqs(items[end + 1 :], anchor):
                return
        except Exception as exc:  # (CompactionError: the request will say so)
            log.debug("recall_speculation_skipped", error=type(exc).__name__)
            return
        task = asyncio.ensure_future(search_for(self, items, room, cfg, self._state.head))
        self._state.ledger.keep(task)
        task.add_done_callback(_retrieved)
        self._spec = _Speculation(task, tuple(items[: end + 1]), anchor, room, cfg)

    def _drop_speculation(self) -> None:
        # A search in flight is left to finish (its outcome dropped, ``_retrieved``; the
        # ledger's close waits for it): cancelling a query costs the server a cancel
        # request and the pool a connection reset, more than the search itself.
        self._spec = None

    def _speculated(
        self, items: Sequence[ViewItem], room: int, cfg: ContextConfig
    ) -> asyncio.Future[RecallBlock] | None:
        """The speculation's search if it is the one this request would start, else None."""
        spec, self._spec = self._spec, None
        if spec is None:
            return None
        end = query_end(items)
        if (
            end is not None
            and spec.room == room
            and spec.config is cfg
            and len(spec.prefix) == end + 1
            and anchor_of(items, end, self._state.head) == spec.anchor
            and not (spec.task.done() and (spec.task.cancelled() or spec.task.exception()))
            and tuple(items[: end + 1]) == spec.prefix
            and not carried_seqs(items[end + 1 :], spec.anchor)
        ):
            self.speculation_hits += 1
            return spec.task
        self.speculation_misses += 1
        return None

    async def _answer(
        self, speculated: asyncio.Future[RecallBlock], items: Sequence[ViewItem], room: int
    ) -> RecallBlock:
        """The speculation's block; if it failed after it was taken (a dropped connection,
        say), the request's own search, which fails typed if the cause persists."""
        try:
            return await asyncio.shield(speculated)
        except Exception:
            return await search_for(self, items, room, self._state.config, self._state.head)

    async def close(self, wait_seconds: float) -> None:
        """Wait for a speculation in flight (a search of about a millisecond) and the
        embedding of a backlog, at most ``wait_seconds``; they are left to the ledger's
        close after that."""
        spec, self._spec = self._spec, None
        tasks: list[asyncio.Future[Any]] = [] if spec is None else [spec.task]
        if self._backlog is not None:
            tasks.append(self._backlog)
        running = [t for t in tasks if not t.done()]
        if running:
            await asyncio.wait(running, timeout=wait_seconds)

    def on_refresh(self) -> None:
        """The session re-read its head: the next request checks it again."""
        self._checked = False

    def current_tail(self, n: int) -> list[ViewItem] | None:
        """The view's last ``n`` items, if the planner has seen up to the head."""
        planner = self.planner
        if planner is not None and self._planned == self._state.head:
            return planner.last_items(n)
        return None

    # -- building a request ------------------------------------------------------------

    async def build(
        self, token_budget: int | None, provider: Any | None, *, in_force: bool = True
    ) -> list[dict[str, Any]]:
        """``Session.get_messages_for_request`` for a provider object (or none). Built
        again on the session as it is now when recall's search found the branch replaced
        after the seq the view was planned at (another writer's rollback or clear landed
        in between): the request is always the one ``request_at`` rebuilds at its seq."""
        for _ in range(MAX_REBUILDS):
            try:
                return await self._build(token_budget, provider, in_force)
            except BranchMoved:
                self.view_changed()
                self._checked = False
        return await self._build(token_budget, provider, in_force)

    async def _build(
        self, token_budget: int | None, provider: Any | None, in_force: bool
    ) -> list[dict[str, Any]]:
        s = self._s
        self._state.ledger.check_open()
        if not self._checked:  # another writer may have appended, changed the settings,
            # or purged the session and created it again (``Session._follow``)
            await s._follow()
        budget = s.budget(token_budget, provider).available
        if token_budget is not None and in_force:
            self.token_budget = token_budget
        cfg = self._state.config
        recall_room = reserve_for(budget, cfg.recall)  # the recall block's share
        extra = extra_for(budget, cfg.recall)  # and what it may take for a question
        budget -= recall_room
        # 1. plan, and 2. fit (ephemeral messages merged in; the engine only when over the
        # budget): one request at a time per handle, so requests built at once on a shared
        # handle (the service's) catch the planner up once, not each with the same events
        overflow: CompactionError | None = None
        async with self._planning:
            planner = await self._request_planner(budget, recall_room)
            head = self._planned
            try:
                items = planner.view(self._state.ephemeral)
            except CompactionError as exc:
                overflow = exc
        if overflow is not None:
            await s.hooks.emit(
                hk.OVERFLOW, {"estimated_tokens": planner.tokens, "context_limit": budget}
            )
            raise overflow
        if planner.passes != self._seen_passes:
            await self._announce_pass(planner, items)
        self._seen_passes = planner.passes
        self._compactor.summarize_in_background(planner)
        self.request_seq = head
        BUILT_AT.set((self, head))
        # 3. recall what the view left out, just before the latest turn, and 4. finish for
        # the provider: the search's statement goes out first, and the view is finished
        # while the server works (0.3 ms of a ~2 ms request at 800 items)
        model = target_model(provider, s.model)
        self._room = recall_room
        at = latest_turn(items) if recall_room else None
        if extra and not leaves_out(planner.view_tokens, items):
            extra = 0  # the whole view is carried: nothing to widen recall for
        if at is None or not splice_safe(items, at) or (extra and asks(items)):
            self._drop_speculation()
            sent = await with_recall(
                self, items, recall_room, cfg, upto_seq=head, branch=None, extra=extra
            )
            return finish_request_view(
                sent, target_model=model, cache=self._finished, sized_for=len(items)
            )
        speculated = self._speculated(items, recall_room, cfg)
        if speculated is not None:
            search = asyncio.ensure_future(
                announced(self, self._answer(speculated, items, recall_room))
            )
        else:
            search = asyncio.ensure_future(
                recall_block(self, items, recall_room, cfg, upto_seq=head, branch=None)
            )
            await asyncio.sleep(0)  # the search runs up to its first wait: the statement is sent
        try:
            out, cut = finish_marked(items, at, target_model=model, cache=self._finished)
        except BaseException:
            search.cancel()
            raise
        block = await search
        if block.message is not None:
            item = block_item(items[at], block.message, block)
            out[cut:cut] = finish_request_view([item], target_model=model)
        return out

    async def _announce_pass(self, planner: RequestPlanner, items: Sequence[ViewItem]) -> None:
        tokens = planner.tokens
        after = sum(i.tokens for i in items)
        hooks = self._s.hooks
        await hooks.emit(
            hk.PRE_COMPACT, {"message_count": len(items), "tokens": tokens, "ephemeral": True}
        )
        await hooks.emit(
            hk.POST_COMPACT,
            {
                "message_count": len(items),
                "tokens": after,
                "tokens_before": tokens,
                "tokens_after": after,
                "tokens_saved": max(0, tokens - after),
                "strategy": self._state.config.compaction_strategy,
                "ephemeral": True,
            },
        )

    async def _request_planner(self, budget: int, recall_room: int) -> RequestPlanner:
        """The planner for ``budget``, caught up with the ledger: reused when nothing
        moved, fed just the delta when another writer appended, rebuilt from the view's
        tail (O(budget) rows) when the view was rewritten or the budget changed."""
        planner = self.planner
        if planner is not None and (
            self._planner_budget != budget or planner.config != self._state.config
        ):
            planner = None
        if planner is not None and self._planned < self._state.head:
            planner = await self._catch_up(planner)
        if planner is None:
            planner = await self._load_planner(budget, recall_room)
        self._checked = False
        return planner

    async def _catch_up(self, planner: RequestPlanner) -> RequestPlanner | None:
        """Feed the planner the events it has not seen; None if one rewrote the view."""
        s = self._s
        async for event in self._state.store.read_events(s.session_id, self._planned + 1):
            payload = event.payload
            if isinstance(payload, MessageAppended):
                planner.push(message_item(event.seq, payload))
            elif not isinstance(payload, CheckpointCreated):
                self.view_changed()
                self._writes.forget_tail()
                return None
            self._planned = event.seq
            self._state.advance(event.seq, event.hash)
        self._writes.forget_tail()
        return planner

    async def _load_planner(self, budget: int, recall_room: int) -> RequestPlanner:
        s = self._s
        tail = await self._state.store.read_view_tail(s.session_id, 2 * budget)
        summaries = sum(1 for i in (*tail.pinned, *tail.items) if i.kind == "summary")
        room = budget - summaries * bridge_cost(s.counter)  # finish may add bridges
        if room <= 0:
            raise CompactionError(
                "no room left once bridge messages are reserved", code="NO_TOKEN_BUDGET"
            )
        whole = room + recall_room  # the target is a share of the whole request
        planner = RequestPlanner(room, self._state.config, s.counter, whole)
        planner.start(tail.before_tokens, tail.pinned)
        planner.extend(tail.items)
        self.planner, self._planner_budget = planner, budget
        self._planned = tail.head
        self._state.advance(tail.head)  # no hash read: the pin stays an older, valid one
        self._seen_passes = planner.passes
        self._writes.forget_tail()
        return planner

    # -- replaying one -----------------------------------------------------------------

    async def replay(
        self,
        state: ViewState,
        seq: int,
        provider: Any | None,
        token_budget: int | None,
        *,
        branch_seqs: Sequence[int] | None = None,
    ) -> list[dict[str, Any]]:
        """``Session.request_at``: the request built right after ``seq`` (``state``);
        ``branch_seqs``: the branch's seqs then, where ``state`` does not carry the branch
        (read from the branch index, not folded)."""
        s = self._s
        config = (
            self._state.ledger.config_from(state.config) if state.config else self._state.config
        )
        if token_budget is None and provider is None:
            token_budget = self.token_budget
        budget = resolve_budget(
            config, state.model, token_budget=token_budget, provider=provider
        ).available
        recall_room = reserve_for(budget, config.recall)
        extra = extra_for(budget, config.recall)
        budget -= recall_room + bridge_reserve(state.view, s.counter)
        if budget <= 0:
            raise CompactionError(
                "no room left once bridge messages are reserved", code="NO_TOKEN_BUDGET"
            )
        items = plan_view(
            state.view,
            budget_tokens=budget,
            config=config,
            counter=s.counter,
            whole_tokens=budget + recall_room,
        )
        branch = (
            list(branch_seqs)
            if branch_seqs is not None
            else [i.seq for i in state.branch if i.ref[1] == 0]
        )
        if extra and not leaves_out(sum(i.tokens for i in state.view), items):
            extra = 0
        view = await with_recall(
            self, items, recall_room, config, upto_seq=seq, branch=branch, extra=extra
        )
        return finish_request_view(view, target_model=target_model(provider, s.model))
