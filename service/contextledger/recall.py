"""Recall: bring back what compaction left out of a request, from the ledger itself.

A request view leaves turns out (truncated, pruned, summarized) but the ledger
holds all of them. Before a request is sent, the left-out part of the branch is
searched for the latest user turn (and a pending tool call): PostgreSQL full-text
search on ``postgresql://`` (the ``event_search`` vectors, migrations 0003 and 0006),
BM25 (bm25s) on ``memory://``. The pure part (``core.recall``) picks whole tool
units within the recall share and places the block before the latest turn.

Deterministic: the search sees only events up to ``upto_seq`` and, for a replay,
the branch as of that seq, and ranks tie-break by seq, so ``request_at(seq)``
rebuilds the block a live request made at that seq carried.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Collection, Coroutine, Sequence
from dataclasses import dataclass
from operator import attrgetter, itemgetter
from typing import Any, Protocol

import structlog

from contextledger import hooks as hk
from contextledger import telemetry
from contextledger.core.config import REDACTED, ContextConfig, RecallConfig, ts_config_name
from contextledger.core.recall import (
    CARRIED_KINDS,
    RecallBlock,
    Recalled,
    asks_about_past,
    fuse,
    give_back,
    latest_turn,
    make_room,
    message_text,
    pick,
    query_anchor,
    query_end,
    query_text,
    recall_budget,
    room_start,
    search_text,
    strong_matches,
    with_hops,
    with_neighbours,
)
from contextledger.core.recall import place as place_recall
from contextledger.core.tokens import TokenCounter
from contextledger.core.units import is_tool_message
from contextledger.core.view import ViewItem
from contextledger.hooks import HookBus
from contextledger.protocols import LedgerHandle
from contextledger.store.base import BranchMoved, Store

log = structlog.get_logger(__name__)
#: Neighbours fetched around a match so its tool unit (call + results) comes whole.
UNIT_RADIUS = 4
#: How many of a second hop's finds go right after the strong matches (those scoring at
#: least ``STRONG`` times the best); the rest go last.
HOP_FIRST, STRONG = 3, 0.5
#: Events per embedding call. A request makes one at most: its latest turn first, then
#: the newest (what is new since the last request, as a rule). A history beyond it
#: (appended without requests, or before hybrid was on) is embedded off the request path
#: (``embed_backlog``), a call at a time, each batch searchable as it is stored.
EMBED_BATCH = 128
MAX_EMBED_CHARS = 8000


_KIND, _REF, _SEQ = attrgetter("kind"), attrgetter("ref"), itemgetter(0)


def carried_seqs(view: Sequence[ViewItem], upto: int) -> set[int]:
    """The seqs of ledger messages ``view`` carries, up to ``upto``. A view of messages
    only (the usual one: no summary, no ephemeral message) is read at C speed (a
    comprehension over ~800 items was ~50 µs of a request)."""
    if set(map(_KIND, view)) <= CARRIED_KINDS:  # message items always have a ledger seq
        seqs: set[int] = set(map(_SEQ, map(_REF, view)))
        top = max(seqs, default=0)
        if top > upto:  # the few carried after the anchor (a reply, tool results)
            if top - upto < len(seqs):
                seqs.difference_update(range(upto + 1, top + 1))
            else:
                seqs = {s for s in seqs if s <= upto}
        return seqs
    return {i.ref[0] for i in view if 0 < i.ref[0] <= upto and i.kind in CARRIED_KINDS}


def reserve_for(budget_tokens: int, config: RecallConfig) -> int:
    """Tokens of a request budget kept for the recall block (0 when recall is off)."""
    return recall_budget(budget_tokens, config.share) if config.enabled else 0


def extra_for(budget_tokens: int, config: RecallConfig) -> int:
    """Tokens the block may take beyond its share when the latest turn asks about the past
    (``max_share``), out of the view's oldest part (0 when recall is off)."""
    if not config.enabled:
        return 0
    return recall_budget(budget_tokens, config.max_share) - reserve_for(budget_tokens, config)


def asks(view: Sequence[ViewItem]) -> bool:
    """Whether ``view``'s latest turn asks about the past, and the model has not acted on it
    yet (no tool call since): then recall may take more room. In the tool loop that
    follows, the share is the usual one and the search started at each call is used."""
    at = latest_turn(view)
    return at is not None and query_end(view) == at and asks_about_past(query_text(view))


async def recall_for_request(
    store: Store,
    session_id: str,
    *,
    view: Sequence[ViewItem],
    budget_tokens: int,
    config: RecallConfig,
    counter: TokenCounter,
    upto_seq: int,
    branch: Collection[int] | None = None,
    api_key: str | None = None,
    hop: bool = False,
    on_backlog: Callable[[int], None] | None = None,
) -> RecallBlock:
    """The recall block for a request carrying ``view`` (empty when nothing relevant
    was left out, recall is off, or there is no user turn to search for).

    ``branch`` (a replay's branch as of ``upto_seq``) also means: never call the
    embedder, use only the embeddings a live request had made by then.

    The lexical search is taken as of the query's last message (``query_anchor``), not
    ``upto_seq``: what came after the question (its answer, tool results) is carried by
    the request, and a search anchored there can start before the request is built."""
    # the irregular forms are English words: another configuration searches the turn alone
    english = ts_config_name(config.text_search_config) == "english"
    query = search_text(view) if english else query_text(view)
    if not config.enabled or not query.strip() or budget_tokens <= 0:
        return RecallBlock(None, (), 0, query)
    with telemetry.span(
        "search_memory",
        {
            "gen_ai.operation.name": "search_memory",
            "gen_ai.conversation.id": session_id,
            "gen_ai.memory.store.id": session_id,
            "gen_ai.request.top_k": config.max_matches,
            "contextledger.seq": upto_seq,
            "contextledger.recall.engine": config.engine,
            "contextledger.replay": branch is not None,
            "gen_ai.memory.query.text": query if telemetry.capture_content() else None,
        },
    ) as span:
        block = await _recall(
            _Search(
                store=store,
                session_id=session_id,
                query=query,
                view=view,
                budget_tokens=budget_tokens,
                config=config,
                counter=counter,
                upto_seq=upto_seq,
                branch=branch,
                api_key=api_key,
                hop=hop,
                on_backlog=on_backlog,
            )
        )
        if span is not None:
            span.set_attribute("gen_ai.memory.record.count", len(block.seqs))
            span.set_attribute("contextledger.recall.tokens", block.tokens)
        return block


@dataclass(frozen=True, slots=True)
class _Search:
    """One recall search, as ``recall_for_request`` was asked for it (its arguments, and
    the query taken from the view): what ``_recall`` and ``_semantic`` work from."""

    store: Store
    session_id: str
    query: str
    view: Sequence[ViewItem]
    budget_tokens: int
    config: RecallConfig
    counter: TokenCounter
    upto_seq: int
    branch: Collection[int] | None
    api_key: str | None
    hop: bool
    #: called (with ``upto_seq``) when a live request left messages unembedded
    on_backlog: Callable[[int], None] | None = None


async def _recall(q: _Search) -> RecallBlock:
    store, session_id, query, view, config = q.store, q.session_id, q.query, q.view, q.config
    upto_seq, branch = q.upto_seq, q.branch
    anchor = query_anchor(view, upto_seq)
    carried = carried_seqs(view, anchor)
    matches, messages = await store.search_messages(
        session_id,
        query,
        exclude=carried,
        upto_seq=anchor,
        branch=branch,
        limit=config.max_matches,
        text_config=config.text_search_config,
        head=upto_seq if branch is None else None,
        hop=q.hop,
    )
    ranked = [seq for seq, score in matches if score > 0]
    hops = [seq for seq, score in matches if score < 0]  # the second hop's, best first
    # hybrid's embeddings are searched up to ``upto_seq``, as are their units' neighbours
    hybrid = config.engine == "hybrid" and bool(config.embedding_model)
    if hybrid:
        carried = carried_seqs(view, upto_seq)
        nearest = await _semantic(q, carried)
        if nearest:
            # each ranker's candidates, all of them, in the fused order: the block takes
            # what fits (cut to ``max_matches`` after the fusion, an embedding's finds
            # below its 20th were lost wherever the lexical list was noise, a paraphrase's)
            ranked = fuse([ranked, nearest])
            # the embedding's own finds, read by key (the lexical search's neighbours and
            # second hop are among the messages: counting those, a request whose lexical
            # search found neighbours skipped this read and lost every such find)
            unread = set(ranked) - {m.seq for m in messages}
            if unread:
                messages += await store.recall_messages(
                    session_id, unread, upto_seq=upto_seq, branch=branch
                )
        if (
            branch is None
            and await store.vectors_available()  # (cached: else nothing was read here)
            and await store.branch_base(session_id) > upto_seq
        ):
            # the embedder's call and the reads of its finds came after the lexical
            # search's own check: a rollback or clear that landed meanwhile gave them
            # another branch than the request's (``request_path.build`` builds it again)
            raise BranchMoved(session_id)
    if not ranked:
        return RecallBlock(None, (), 0, query)
    window: set[int] = set()  # a tool call or result comes with the rest of its unit
    for rec in messages:
        if is_tool_message(rec.message):
            window.update(range(max(1, rec.seq - UNIT_RADIUS), rec.seq + UNIT_RADIUS + 1))
    window -= carried | set(ranked)
    if window:
        messages += await store.recall_messages(
            session_id, window, upto_seq=upto_seq if hybrid else anchor, branch=branch
        )
    order = with_neighbours(ranked, {m.seq for m in messages})
    # the hop's best right after the strong matches (scoring at least half the best: what
    # the hop was found through) among the first ``max_matches`` (a hybrid's fused list
    # holds both rankers' candidates), before the weak ones; the rest after everything
    if hops:
        strong = strong_matches(matches, ranked[: config.max_matches], share=STRONG)
        order = with_hops(order, hops, strong, first=HOP_FIRST)
    return pick(order, messages, budget_tokens=q.budget_tokens, counter=q.counter, query=query)


async def _semantic(q: _Search, carried: Collection[int]) -> list[int]:
    """Left-out seqs nearest the latest turn by embedding; [] where vectors are not kept
    (memory://, PostgreSQL without pgvector) or the embedder fails (lexical recall stays)."""
    store, session_id, view, config = q.store, q.session_id, q.view, q.config
    upto_seq, branch = q.upto_seq, q.branch
    model = config.embedding_model
    at = latest_turn(view)
    if model is None or at is None or view[at].seq <= 0 or not await store.vectors_available():
        return []
    turn = view[at].seq
    if branch is None:  # a live request embeds what is new; a replay never calls a model
        todo = await store.unembedded(
            session_id, model, upto_seq=upto_seq, first=(turn,), limit=EMBED_BATCH
        )
        try:
            if todo:
                pairs = await embedded(todo, config, q.api_key)
                await store.store_embeddings(session_id, model, upto_seq, pairs)
        except Exception as exc:  # a failing embedder must not fail the request
            log.warning("recall_embedding_failed", model=model, error=f"{type(exc).__name__}")
        else:
            if len(todo) == EMBED_BATCH and q.on_backlog is not None:
                q.on_backlog(upto_seq)  # there may be more: embedded off the request path
    found = await store.vector_search(
        session_id,
        model,
        turn,
        exclude=carried,
        upto_seq=upto_seq,
        branch=branch,
        limit=config.max_matches,
    )
    return [seq for seq, _ in found]


async def embed_backlog(
    store: Store, session_id: str, config: RecallConfig, api_key: str | None, upto_seq: int
) -> int:
    """Embed the messages up to ``upto_seq`` that no request embedded, newest first, a
    batch at a time; each batch is searchable by the requests after the head it was
    stored at (``Store.store_embeddings_behind``: what a replay at a seq sees is what the
    live request saw). Stops when none is left, the session is gone, or at the first
    failure (logged: the next request that leaves a backlog starts again). Returns how
    many it stored."""
    model = config.embedding_model
    if model is None:
        return 0
    stored, last = 0, None
    try:
        while True:
            todo = await store.unembedded(
                session_id, model, upto_seq=upto_seq, first=(), limit=EMBED_BATCH
            )
            if not todo or todo[0].seq == last:  # (a batch that stored nothing: stop)
                return stored
            last = todo[0].seq
            pairs = await embedded(todo, config, api_key)
            if not await store.store_embeddings_behind(session_id, model, pairs):
                return stored
            stored += len(pairs)
    except Exception as exc:  # (nobody awaits this: say why it stopped)
        log.warning("recall_backlog_failed", model=model, error=f"{type(exc).__name__}")
        return stored


async def embedded(
    messages: Sequence[Recalled], config: RecallConfig, api_key: str | None
) -> list[tuple[Recalled, list[float]]]:
    """Each message with its embedding (of its text, clipped; one call)."""
    texts = [message_text(r.message)[:MAX_EMBED_CHARS] or " " for r in messages]
    return list(zip(messages, await embed(texts, config, api_key), strict=True))


async def embed(
    texts: Sequence[str], config: RecallConfig, api_key: str | None
) -> list[list[float]]:
    """Embeddings through litellm (any provider, local servers included)."""
    from contextledger._litellm import import_litellm

    litellm = await asyncio.to_thread(import_litellm)  # ~2 s the first time: off the loop
    kwargs: dict[str, Any] = {"model": config.embedding_model, "input": list(texts), "timeout": 30}
    if config.embedding_api_base is not None:
        kwargs["api_base"] = config.embedding_api_base
    if api_key is not None:
        kwargs["api_key"] = api_key
    response = await litellm.aembedding(**kwargs)
    return [list(map(float, item["embedding"])) for item in response.data]


class RecallingSession(Protocol):
    """What recall needs of the session it searches for (a port: recall.py never imports
    session.py; the request path provides it)."""

    @property
    def session_id(self) -> str: ...
    @property
    def counter(self) -> TokenCounter: ...
    @property
    def hooks(self) -> HookBus: ...
    @property
    def store(self) -> Store: ...
    @property
    def ledger(self) -> LedgerHandle: ...
    def start_backlog(self, cfg: ContextConfig, upto_seq: int) -> None:
        """Start ``embed_backlog`` for this session, unless it runs already."""
        ...


def embedding_key(session: RecallingSession, cfg: ContextConfig) -> str | None:
    """The recall embedder's key: configs are recorded redacted, keys stay in-process."""
    rc = cfg.recall
    if rc.embedding_api_key and rc.embedding_api_key != REDACTED:
        return rc.embedding_api_key
    if rc.embedding_model is None:
        return None
    return session.ledger.secret(rc.embedding_model, rc.embedding_api_base)


async def with_recall(
    session: RecallingSession,
    view: Sequence[ViewItem],
    room: int,
    cfg: ContextConfig,
    *,
    upto_seq: int,
    branch: Collection[int] | None,
    extra: int = 0,
) -> Sequence[ViewItem]:
    """``view`` with the recall block of what it left out, announced on the hook bus.

    With ``extra`` and a latest turn that asks about the past, the view's oldest messages
    (up to ``extra`` tokens, the recent part stays) are left out too and the block may
    take their room; the newest of them that the block leaves room for come back."""
    start = end = room_start(view)
    if extra > 0 and asks(view):
        end = make_room(view, extra)
    if end == start:
        block = await recall_block(session, view, room, cfg, upto_seq=upto_seq, branch=branch)
        return view if block.empty else place_recall(view, block)
    gained = sum(item.tokens for item in view[start:end])
    narrowed = [*view[:start], *view[end:]]
    block = await recall_block(
        session, narrowed, room + gained, cfg, upto_seq=upto_seq, branch=branch, hop=True
    )
    back = give_back(view, start, end, room + gained - block.tokens, set(block.seqs))
    narrowed = [*view[:start], *back, *view[end:]]
    return narrowed if block.empty else place_recall(narrowed, block)


async def recall_block(
    session: RecallingSession,
    view: Sequence[ViewItem],
    room: int,
    cfg: ContextConfig,
    *,
    upto_seq: int,
    branch: Collection[int] | None,
    hop: bool = False,
) -> RecallBlock:
    """The recall block for ``view`` (``with_recall`` without placing it), announced on
    the hook bus when not empty; ``hop``: with a second hop (a question's)."""
    if not room:
        return RecallBlock(None, (), 0, "")
    search = search_for(session, view, room, cfg, upto_seq, branch, hop=hop)
    return await announced(session, search)


def search_for(
    session: RecallingSession,
    view: Sequence[ViewItem],
    room: int,
    cfg: ContextConfig,
    upto_seq: int,
    branch: Collection[int] | None = None,
    *,
    hop: bool = False,
) -> Coroutine[Any, Any, RecallBlock]:
    """``recall_for_request`` for ``session``'s store, config and key (not announced)."""
    return recall_for_request(
        session.store,
        session.session_id,
        view=view,
        budget_tokens=room,
        config=cfg.recall,
        counter=session.counter,
        upto_seq=upto_seq,
        branch=branch,
        api_key=embedding_key(session, cfg),
        hop=hop,
        on_backlog=lambda upto: session.start_backlog(cfg, upto),
    )


async def announced(session: RecallingSession, search: Awaitable[RecallBlock]) -> RecallBlock:
    """``search``'s block, announced on the hook bus (``context:include``) when not empty."""
    block = await search
    if not block.empty:
        await session.hooks.emit(
            hk.INCLUDE, {"source": "recall", "seqs": list(block.seqs), "tokens": block.tokens}
        )
    return block
