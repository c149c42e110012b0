"""Recall's postings held by the process that searches a session (the search's warm path).

The one-statement search (``search.py``) scored BM25 in SQL over every posting it read:
~8 ms a request at 1,000 turns and growing with the deep read (12.9 ms at 5,000). Here
a statement only catches the postings up (the new messages' postings, computed from
their events) and returns them with the query's lexemes; the process keeps each
session's postings (``postings.Postings``) and ranks them with ``memory://``'s code
(``postings.search``), then reads the matches' messages by key.

Nothing on the request path writes or reads the history whole:
- the new messages' postings are stored after the request, a batch at a time
  (``Search._index_later``), for the next process that searches the session;
- a process that did not hold the session from its start holds it from where it caught
  up (``Postings.base``): a search that reads further back loads those lexemes' older
  postings newest first by the key (``Missing``, ``fill``), then the rest is read in a
  task and added a few lexemes at a time, if it fits the process's budget (``complete``).

An append through this store to a session held here computes the message's postings in
its own statement (``statements.APPEND_MESSAGE``; for a human turn or a tool call after
it, the lexemes of the query a request would ask then, ``query_of``), and the hold keeps
them linked by the chain (``appended``): a request whose seq they reach, asking with that
text, then makes no catch-up statement (``_caught_up``). Another
writer's event, a cold-path event or a store that calls the append functions (Citus,
PgBouncer) leaves a gap in that chain, and the next request catches up.

Live searches and replays take this path alike, so ``request_at`` rebuilds the block the
live request made. Citus and other text search configurations keep the SQL search.
"""

from __future__ import annotations

import asyncio
import itertools
import sys
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Collection, Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

import structlog

from contextledger.core.recall import MAX_QUERY_CHARS, message_text
from contextledger.core.units import is_human_turn, tool_calls
from contextledger.core.word_forms import with_forms, without_forms
from contextledger.store.lexical import neighbours
from contextledger.store.postgres.statements import S
from contextledger.store.postings import Branch, Missing, Postings, search

log = structlog.get_logger(__name__)

#: Rows of ``BELOW`` a page: what the process holds in rows at once while it reads the
#: rest of a session's postings (~150 bytes a row before they become ~20 a posting).
BELOW_PAGE = 50_000

#: Postings the warm indexes of a process hold at most, every store's sessions together (a
#: service opens a store per tenant), ~20 bytes each: ~40 MB; a 20,000-turn session of
#: bench/turns.py's text holds ~1.8 million. The least recently searched sessions are
#: dropped first (their next search reads again what it needs).
WARM_BUDGET = 2_000_000
#: The search's catch-up (``search._CATCH_UP``), started after the seq the process holds
#: postings up to ($from; NULL, none held yet: after the stored ones, read as needed), and
#: what a sync checks the held postings against: the head and its hash, the branch's base
#: and view generation, the hash at $from (still the chain this process read?).
FROM_HELD = (
    "generate_series((SELECT upto FROM indexed) + 1,",
    "generate_series(coalesce($from::bigint, (SELECT upto FROM indexed)) + 1,",
)
FACTS = f""" facts AS MATERIALIZED (
    SELECT h.head, h.last_hash, h.branch_base, h.view_gen, (SELECT upto FROM indexed) AS indexed,
           (SELECT g.hash FROM {S}.events g
             WHERE g.session_id = $1 AND g.seq = $from::bigint
               AND g.tenant_id = {S}.current_tenant()) AS at_from
      FROM {S}.sessions h WHERE h.session_id = $1 AND h.tenant_id = {S}.current_tenant()
),"""
SYNC_TAIL = """ q AS (
    SELECT l FROM unnest(tsvector_to_array(to_tsvector($config::regconfig, $query))) l
)
SELECT 0 AS kind, lexeme, seq, tf::int, dl::int, NULL::text AS hash FROM fresh
UNION ALL SELECT 1, l, 0, 0, 0, NULL FROM q
UNION ALL SELECT 2, NULL, head, 0, 0, last_hash FROM facts
UNION ALL SELECT 3, NULL, branch_base, 0, 0, NULL FROM facts
UNION ALL SELECT 4, NULL, indexed, 0, 0, at_from FROM facts
UNION ALL SELECT 5, NULL, view_gen, 0, 0, NULL FROM facts"""
#: Postings of lexemes older than those a process holds (``Postings.older``): per lexeme
#: ($terms), the newest $limits of those below its floor ($floors), by the key backwards:
#: a search's reads, never the session's history.
OLDER = f"""
SELECT t.i::int, x.seq, x.tf::int, x.dl::int
  FROM unnest($terms::text[], $floors::bigint[], $limits::int[]) WITH ORDINALITY t(l, f, k, i)
 CROSS JOIN LATERAL (
        SELECT y.seq, y.tf, y.dl FROM {S}.event_terms y
         WHERE y.session_id = $1 AND y.lexeme = t.l AND y.seq < t.f
           AND y.tenant_id = {S}.current_tenant()
         ORDER BY y.seq DESC LIMIT t.k) x
 ORDER BY t.i, x.seq DESC"""
#: A session's stored postings below the seq a process holds them from, read after its
#: first search there, off the request path (``WarmIndexes.complete``): then its searches
#: read nothing more. A page at a time in the key's order, from after ($lexeme, $seq):
#: one index range a page, whatever the history (each lexeme's seqs ascending).
BELOW = f"""
SELECT lexeme, seq, tf::int, dl::int FROM {S}.event_terms
 WHERE session_id = $1 AND tenant_id = {S}.current_tenant()
   AND (lexeme, seq) > ($lexeme::text, $seq::bigint) AND seq < $below
 ORDER BY lexeme, seq LIMIT {BELOW_PAGE}"""
BELOW_COUNT = f"""
SELECT count(*) FROM {S}.event_terms
 WHERE session_id = $1 AND tenant_id = {S}.current_tenant() AND seq < $below"""
#: A lexeme's older postings read at least this many at a time (and as many as are held
#: of it, so a search reading far back, a replay's, takes a few steps, not one a posting).
OLDER_AT_LEAST = 256
#: Messages of the branch by seq (``{branch}``: the live branch's or a replay's predicate),
#: each read by its key: as ``seq = ANY($seqs)`` the generic plan took ``seq <= $upto`` for
#: the index condition and filtered every event of the session (3.7 ms for 58 rows at
#: 1,700 turns; 0.3 ms by key). (``Vectors.recall_messages``: the hybrid engine's reads.)
RECALL_MESSAGES = f"""
SELECT e.seq, (e.data -> 'message')::text, e.tokens, e.created_at
  FROM unnest($seqs::bigint[]) g(seq) CROSS JOIN LATERAL (
        SELECT * FROM {S}.events x
         WHERE x.session_id = $1 AND x.seq = g.seq AND x.tenant_id = {S}.current_tenant()
        OFFSET 0) e
 WHERE {{branch}}
 ORDER BY e.seq"""
#: The warm search's matches and neighbours: messages by seq as ``RECALL_MESSAGES`` reads
#: them, up to the request's seq ($upto), whatever the branch is now: the seqs are of the
#: branch the ranking kept to (``ranked``; a rollback that landed since is after the
#: request's seq, and the live branch's predicate would drop the request's own).
MATCHED_MESSAGES = RECALL_MESSAGES.format(
    branch="e.type = 'message.appended' AND e.seq <= $upto::bigint"
)
#: The messages of the branch below its base (after a rollback; ``_BRANCH_SEQS``).
BRANCH_BELOW = f"""
SELECT seq FROM {S}.branch_items
 WHERE session_id = $1 AND part = 0 AND tenant_id = {S}.current_tenant()"""


#: Messages an append may link onto a hold before the next request (past it, a gap: the
#: request catches up as before); each holds its postings until that request.
MAX_LINKS = 256


@dataclass(frozen=True, slots=True)
class Lexed:
    """What an append computed of its message (``APPEND_MESSAGE``): its lexemes (interned,
    as the postings hold them) and their counts, its length, and for a human turn
    ``(query text, its lexemes)``."""

    lexemes: list[str]
    tfs: list[int]
    dl: int
    query: tuple[str, list[str]] | None = None

    def rows(self, seq: int) -> list[tuple[str, int, int, int]]:
        """The message's postings ``(lexeme, seq, tf, dl)`` as ``POSTINGS`` spells them:
        each count at most 32,767, and the empty lexeme's row last."""
        dl = self.dl
        rows = [
            (lx, seq, min(tf, 32767), dl) for lx, tf in zip(self.lexemes, self.tfs, strict=True)
        ]
        rows.append(("", seq, 0, dl))
        return rows


#: An append's answer: the session's new view tokens and what it lexed (None: nothing).
Appended = tuple[int, Lexed | None]


@dataclass(frozen=True, slots=True)
class _Link:
    """A message this store appended onto ``prior`` (seq, hash), with what it lexed."""

    prior: tuple[int, str]
    seq: int
    hash: str
    lexed: Lexed


def query_of(message: Mapping[str, Any], asking: str | None = None) -> str | None:
    """The text a request asks recall with when ``message`` is the last one its query
    reads (``core.recall.search_text``): a human turn's own text; a tool call's, after the
    text asked so far (``asking``: the latest human turn and the tool calls after it, as
    this store's appends left it). None when it would not be that, or not known here: a
    request compares the text it asks with exactly, so a wrong guess costs a catch-up."""
    if is_human_turn(message):
        return with_forms(message_text(message)[:MAX_QUERY_CHARS]) or None
    if asking is None or not tool_calls(message):
        return None
    part = message_text(message)[:MAX_QUERY_CHARS]
    return with_forms(f"{without_forms(asking)}\n{part}") if part else None


def lexed(query: str | None, columns: Sequence[Any]) -> Lexed | None:
    """An append's lexed columns (``lexemes.LEXED``'s lexemes and counts, and the query's
    lexemes) as ``Lexed`` (the length as ``POSTINGS`` has it: the counts summed, at most
    32,767; a message without words has 32,767, as ``least(NULL, 32767)`` makes it); None
    when the append was not asked to lex."""
    lexemes, tfs, query_lexemes = columns
    if lexemes is None:
        return None
    dl = min(sum(tfs), 32767) if tfs else 32767
    asked = (
        (query, list(query_lexemes)) if query is not None and query_lexemes is not None else None
    )
    return Lexed([sys.intern(lx) for lx in lexemes], list(tfs), dl, asked)


@dataclass
class _Warm:
    """One session's postings here, and what they were read with."""

    postings: Postings = field(default_factory=Postings)
    #: the hash of the event at ``postings.upto`` (None: nothing loaded yet)
    tip: str | None = None
    #: the session's branch base and view generation when last read, and the branch's
    #: seqs below the base (read again when either changed: a rollback, a repair)
    base: int = 0
    gen: int = 0
    below: frozenset[int] = frozenset()
    size: int = 0
    #: when it was last searched (a process-wide count)
    used: int = 0
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    #: whether the postings below ``postings.base`` were asked for (``complete_later``)
    asked: bool = False
    #: the seq the server's stored postings reach (as last read, or stored since)
    indexed: int = 0
    #: messages appended here since the postings' ``upto``, each linked onto the one
    #: before (``WarmIndexes.appended``); None: a gap since, the next request catches up
    links: list[_Link] | None = field(default_factory=list)
    #: the query the latest human turn (and tool calls after it) appended here would
    #: ask: its text and lexemes
    query: tuple[str, list[str]] | None = None

    @property
    def held(self) -> int:
        """The postings held: loaded, and carried by the links (the process's budget
        counts both)."""
        return self.postings.size + sum(len(link.lexed.lexemes) + 1 for link in self.links or ())


@dataclass(frozen=True, slots=True)
class Synced:
    """A search's catch-up: the query's lexemes and the session's branch (None: all)."""

    session_id: str
    postings: Postings
    lexemes: list[str]
    on_branch: Branch | None
    #: whether the server's stored postings lack a message this catch-up read, and how
    #: many seqs the session's head is past the last stored one
    unstored: bool = False
    lag: int = 0


Fetch = Callable[[str, dict[str, Any]], Any]


class _Process:
    """Every store's warm indexes in this process, and the postings they hold together.

    Stores may live on several threads' event loops (an adapter's loop thread, a ledger
    per thread), and one store's eviction drops another's holds: the holds' order, the
    total and the set of stores change only under ``lock`` (re-entrant: a store's
    ``__del__`` may run in a collection while its thread holds it)."""

    def __init__(self) -> None:
        self.indexes: weakref.WeakSet[WarmIndexes] = weakref.WeakSet()
        self.total = 0
        self.ticks = itertools.count(1)
        self.lock = threading.RLock()


_PROCESS = _Process()
#: One session's rest read at a time in a process (per event loop): loads that all passed
#: the budget check at once would overcommit it, and each holds a search connection.
_LOADING: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] = (
    weakref.WeakKeyDictionary()
)


def _loading() -> asyncio.Lock:
    loop = asyncio.get_running_loop()
    lock = _LOADING.get(loop)
    if lock is None:
        lock = _LOADING[loop] = asyncio.Lock()
    return lock


class WarmIndexes:
    """The warm indexes of one store; the budget is the process's (``WARM_BUDGET``)."""

    def __init__(self, budget: int = WARM_BUDGET) -> None:
        self._held: OrderedDict[str, _Warm] = OrderedDict()
        self._budget = budget
        self._completing: set[asyncio.Task[None]] = set()
        self._closed = False
        #: requests that the appends made here had caught up (no catch-up statement)
        self.caught_up = 0
        with _PROCESS.lock:
            _PROCESS.indexes.add(self)

    def __del__(self) -> None:
        with _PROCESS.lock:
            _PROCESS.total -= sum(w.size for w in self._held.values())

    def forget(self, session_id: str) -> None:
        """Drop a session's postings (purged, erased: its next search loads afresh)."""
        with _PROCESS.lock:
            warm = self._held.pop(session_id, None)
            if warm is not None:
                _PROCESS.total -= warm.size

    def lexes(self, session_id: str, count: int = 1) -> bool:
        """Whether an append of ``count`` messages to the session should compute their
        postings: the session is held here, loaded, its links have no gap, and they have
        room for all of them (past ``MAX_LINKS`` the hold would drop what was computed)."""
        warm = self._held.get(session_id)
        return (
            warm is not None
            and warm.tip is not None
            and warm.links is not None
            and len(warm.links) + count <= MAX_LINKS
        )

    def queries(self, session_id: str, messages: Sequence[Mapping[str, Any]]) -> list[str | None]:
        """The text a request would ask after each of ``messages`` appended in order
        (``query_of``), from the query the session's appends or catch-ups here left."""
        warm = self._held.get(session_id)
        asking = warm.query[0] if warm is not None and warm.query is not None else None
        out: list[str | None] = []
        for message in messages:
            query = query_of(message, asking)
            out.append(query)
            asking = query or asking
        return out

    def appended(
        self, session_id: str, prior: tuple[int, str], tip: tuple[int, str], lexed: Lexed | None
    ) -> None:
        """An append through this store linked ``tip`` onto ``prior``: what it lexed is
        kept for the next request if it continues the chain the hold follows; else
        (another writer's events in between, nothing lexed, too many) the hold has a gap
        until a request catches up. Kept postings count in the process's budget."""
        warm = self._held.get(session_id)
        if warm is None or warm.links is None:
            return
        links = warm.links
        end = (links[-1].seq, links[-1].hash) if links else (warm.postings.upto, warm.tip)
        if lexed is None or prior != end or len(links) >= MAX_LINKS:
            self.unlink(session_id)
            return
        links.append(_Link(prior, tip[0], tip[1], lexed))
        if lexed.query is not None:
            warm.query = lexed.query
        self._account(session_id, warm)

    def unlink(self, session_id: str) -> None:
        """A gap in what the session's appends here linked (or the chain is another now:
        the store read a head it did not extend): its next request catches up."""
        warm = self._held.get(session_id)
        if warm is not None and warm.links is not None:
            warm.links = None
            self._account(session_id, warm)

    async def sync(
        self,
        session_id: str,
        query: str,
        config: str,
        fetch: Fetch,
        sql: str,
        *,
        seq: int | None = None,
        tip: tuple[int, str] | None = None,
    ) -> Synced | None:
        """The session's postings caught up with the ledger (``fetch`` runs a statement
        by its named values; ``sql`` is the catch-up's text). None: no session. A request
        at ``seq`` that the appends made here have caught up, up to the chain's ``tip``
        as the store last knew it (``_caught_up``), makes no statement."""
        with _PROCESS.lock:
            warm = self._held.get(session_id)
            if warm is None:
                warm = self._held[session_id] = _Warm()
            self._held.move_to_end(session_id)
        warm.used = next(_PROCESS.ticks)  # (a first load in progress is the newest)
        async with warm.lock:
            held = warm.postings
            lexemes = self._caught_up(warm, query, seq, tip)
            if lexemes is not None:
                taken = self._take_links(warm)
                unstored = bool(taken) and taken[-1].seq > warm.indexed
                lag = held.upto - warm.indexed if unstored else 0
                self.caught_up += 1
            else:
                start = held.upto if warm.tip is not None else None
                rows = await fetch(sql, {"from": start, "query": query, "config": config})
                fresh = []
                lexemes = []
                facts: dict[int, tuple[int, str | None]] = {}
                for kind, lexeme, at, tf, dl, text in rows:
                    if kind == 0:
                        fresh.append((lexeme, at, tf, dl))
                    elif kind == 1:
                        lexemes.append(lexeme)
                    else:
                        facts[kind] = (at, text)
                if len(facts) < 4:  # no such session (purged, say)
                    self.forget(session_id)
                    return None
                (head, head_hash), (base, _), (indexed, at_from), (gen, _) = (
                    facts[k] for k in (2, 3, 4, 5)
                )
                if warm.tip is not None and at_from != warm.tip:
                    # another chain under the same id (purged and written again): start over
                    self.forget(session_id)
                    return await self.sync(session_id, query, config, fetch, sql)
                unstored = any(r[1] > indexed for r in fresh)
                if warm.tip is None:  # the stored postings are read as searches need them
                    held.base = indexed + 1
                fresh = sorted((r for r in fresh if r[1] > held.upto), key=lambda r: r[1])
                held.extend(fresh)
                held.upto, warm.tip = head, head_hash
                warm.indexed = max(warm.indexed, indexed)
                # caught up (over a gap: appends link on again; appends that ended during
                # the read and are past it stay)
                warm.links = [link for link in warm.links or () if link.seq > head]
                # the query asked now: a tool call appended next asks it and the call's
                # text (``query_of``), and a request asking it again needs no catch-up
                warm.query = (query, list(lexemes))
                if (base, gen) != (warm.base, warm.gen):
                    below = await fetch(BRANCH_BELOW, {}) if base else []
                    warm.base, warm.gen, warm.below = base, gen, frozenset(r[0] for r in below)
                lag = head - indexed
        self._account(session_id, warm)  # (not if dropped meanwhile: then uncounted)
        on_branch = Branch(warm.base, warm.below) if warm.base else None
        return Synced(session_id, held, lexemes, on_branch, unstored, lag)

    @staticmethod
    def _caught_up(
        warm: _Warm, query: str, seq: int | None, tip: tuple[int, str] | None
    ) -> list[str] | None:
        """The query's lexemes if the hold needs no catch-up for a request at ``seq``
        asking ``query``: the appends linked since (each by this store, onto the one
        before, from the postings' tip: nobody else wrote in between) reach ``seq`` and
        end at ``tip``, the chain's tip as the store last extended or read it (a head it
        read elsewhere, another chain under the id after a purge: catch up), and
        ``query`` is the text the latest lexed query was (``query_of``). The
        branch and the stored postings are the hold's as last read: only messages were
        appended since. None: catch up."""
        if seq is None or warm.tip is None or warm.links is None or warm.query is None:
            return None
        if warm.query[0] != query:
            return None
        held = warm.postings
        at = (held.upto, warm.tip)
        for link in warm.links:
            if link.seq <= held.upto:
                continue
            if link.prior != at:
                return None
            at = (link.seq, link.hash)
        return list(warm.query[1]) if seq <= at[0] and at == tip else None

    @staticmethod
    def _take_links(warm: _Warm) -> list[_Link]:
        """The links past the postings' ``upto``, added to them (``_caught_up`` said
        they form the chain from its tip)."""
        held = warm.postings
        links = [link for link in warm.links or () if link.seq > held.upto]
        if links:
            held.extend([r for link in links for r in link.lexed.rows(link.seq)])
            held.upto, warm.tip = links[-1].seq, links[-1].hash
        warm.links = []
        return links

    def stored(self, session_id: str, upto: int) -> None:
        """The server's postings now reach ``upto`` (``Search._index``)."""
        warm = self._held.get(session_id)
        if warm is not None:
            warm.indexed = max(warm.indexed, upto)

    async def fill(self, synced: Synced, missing: Missing, fetch: Fetch, forward_sql: str) -> None:
        """What a search of ``synced``'s postings found missing (``Postings.older``,
        ``Postings.forward``), loaded into them (held here or dropped meanwhile: the
        search goes on with them either way): one statement for the lexemes, one for the
        messages whose lexemes a second hop needs. Each call lowers a lexeme's floor or
        completes it, or adds a message's lexemes, or finds that another search of the
        session (or ``complete``) did so while it waited for the lock: nothing is read
        then, and the search ranks again. So a search's rounds end (``MAX_FILLS``)."""
        held = synced.postings
        warm = self._holding(synced)
        async with warm.lock if warm is not None else nullcontext():
            terms = [t for t in sorted(missing.terms) if held.floor(t) > 1]
            if terms:
                floors = [held.floor(t) for t in terms]
                limits = [
                    max(OLDER_AT_LEAST, missing.terms[t], len(held.seqs.get(t, ()))) for t in terms
                ]
                values = {"terms": terms, "floors": floors, "limits": limits}
                rows = await fetch(OLDER, values)
                found: dict[int, list[tuple[int, int, int]]] = {}
                for i, seq, tf, dl in rows:
                    found.setdefault(i, []).append((seq, tf, dl))
                for i, term in enumerate(terms, start=1):
                    if held.floor(term) == floors[i - 1]:  # (not loaded meanwhile)
                        got = found.get(i, [])
                        held.older(term, got, whole=len(got) < limits[i - 1])
            seqs = sorted(s for s in missing.forward if s not in held.lexemes)
            if seqs:
                read = {r[0]: r[1] for r in await fetch(forward_sql, {"seqs": seqs})}
                for seq in seqs:
                    held.forward(seq, read.get(seq) or ())
        if warm is not None:
            self._account(synced.session_id, warm)

    def _holding(self, synced: Synced) -> _Warm | None:
        """The hold ``synced`` came from, if it is still the one held here."""
        warm = self._held.get(synced.session_id)
        return warm if warm is not None and warm.postings is synced.postings else None

    def complete_later(self, session_id: str, fetch: Fetch) -> None:
        """Read the rest of the session's postings (below those held) in a task
        (``complete``), once per hold, unless this store is closing."""
        warm = self._held.get(session_id)
        if self._closed or warm is None or warm.asked or warm.postings.base <= 1:
            return
        warm.asked = True
        task = asyncio.get_running_loop().create_task(self.complete(session_id, warm, fetch))
        self._completing.add(task)
        task.add_done_callback(self._completing.discard)

    async def complete(self, session_id: str, warm: _Warm, fetch: Fetch) -> None:
        """The stored postings below those ``warm`` holds, read and added: one session at
        a time in the process; counted on the server first, and not read when they would
        not fit the budget without dropping others (then its searches go on reading what
        they need); read a page at a time by the key (``BELOW``), each page's whole
        lexemes added at once, the event loop let go between. Given up when the session
        is dropped or started over meanwhile."""
        try:
            async with _loading():
                base = warm.postings.base
                (count,) = await fetch(BELOW_COUNT, {"below": base})
                if self._held.get(session_id) is not warm or warm.postings.base != base:
                    return
                if _PROCESS.total + count[0] > self._budget:
                    return
                held, after = warm.postings, ("", 0)
                forward: dict[int, list[str]] = {}
                carried: list[Any] = []  # a lexeme's rows a page ended in the middle of
                while True:
                    values = {"below": base, "lexeme": after[0], "seq": after[1]}
                    page = await fetch(BELOW, values)
                    if self._held.get(session_id) is not warm or held.base != base:
                        return
                    rows = carried + list(page)
                    last = len(page) < BELOW_PAGE
                    if page:
                        after = (page[-1][0], page[-1][1])
                    cut = len(rows)
                    if not last:  # the last lexeme may go on in the next page
                        while cut > 0 and rows[cut - 1][0] == after[0]:
                            cut -= 1
                    held.below(rows[:cut], base, forward)
                    carried = rows[cut:]
                    self._account(session_id, warm)
                    if last:
                        break
                    await asyncio.sleep(0)
                held.below_done(base, forward)
                self._account(session_id, warm)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # its searches read what they need meanwhile
            log.warning("recall_postings_load_failed", session_id=session_id, error=repr(exc))

    async def wait(self) -> None:
        """Until the loads running now have ended."""
        await asyncio.gather(*self._completing, return_exceptions=True)

    async def aclose(self) -> None:
        """Stop the loads still running, start no more, and drop the postings held (the
        store is closing: their room is the other stores')."""
        self._closed = True
        tasks = list(self._completing)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        with _PROCESS.lock:
            for session_id in list(self._held):
                self.forget(session_id)

    def _account(self, session_id: str, warm: _Warm) -> None:
        """``warm``'s growth counted in the process's total (if it is still held here)."""
        with _PROCESS.lock:
            size = warm.held
            grown, warm.size = size - warm.size, size
            if self._held.get(session_id) is warm:
                _PROCESS.total += grown
                self._evict(warm)

    def _evict(self, keep: _Warm) -> None:
        """The least recently searched sessions of any store dropped, down to the budget
        (under ``_PROCESS.lock``)."""
        if _PROCESS.total <= self._budget:
            return
        held = [
            (w.used, sid, index)
            for index in list(_PROCESS.indexes)
            for sid, w in index._held.items()
            if w is not keep
        ]
        for _, sid, index in sorted(held, key=lambda h: h[0]):
            if _PROCESS.total <= self._budget:
                break
            index.forget(sid)


def gate_open(synced: Synced, gaps: Sequence[int] | None, branch: Collection[int] | None) -> bool:
    """The search's gate (``search._SEARCH``): whether a seq the request leaves out
    (``gaps``; None: too many to probe, open) is a message of the branch."""
    if gaps is None:
        return True
    held = synced.postings
    keep = set(branch) if branch is not None else synced.on_branch
    return any(held.may_be_message(g) and (keep is None or g in keep) for g in gaps)


def ranked(
    synced: Synced,
    *,
    upto_seq: int,
    exclude: Collection[int],
    branch: Collection[int] | None,
    limit: int,
    hop: bool,
) -> tuple[list[tuple[int, float]], list[int]]:
    """The matches (``postings.search``) and the neighbours whose messages come with them,
    all of the branch: the hold's as of its last catch-up (``synced.on_branch``; only this
    store's message appends since, when none was needed), or the replay's ``branch``."""
    keep = Branch.of(set(branch), upto_seq) if branch is not None else synced.on_branch
    found = search(
        synced.postings,
        synced.lexemes,
        upto_seq=upto_seq,
        exclude=exclude,
        on_branch=keep,
        limit=limit,
        hop=hop,
    )
    seqs = {seq for seq, _ in found}
    near = neighbours([seq for seq, score in found if score > 0], upto_seq, exclude)
    return found, [n for n in near if n not in seqs and (keep is None or n in keep)]
