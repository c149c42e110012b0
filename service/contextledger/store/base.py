"""The ``Store`` port: what every store provides, each method documented, and its report types.

A store persists events and keeps the inline projection in step with them. The
decisions (which seq, which hash, what the view becomes, whether an event is
admissible at all) are made by ``core.projection.record_events`` — pure, so the
in-memory store and the PostgreSQL store cannot drift apart.
"""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator, Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from contextledger.core.chain import VerifyReport, verify_chain
from contextledger.core.events import (
    Event,
    Payload,
    SessionCreated,
)
from contextledger.core.recall import Recalled
from contextledger.core.view import ViewItem
from contextledger.errors import ConcurrencyError


@dataclass(frozen=True)
class SessionInfo:
    """A session's row: its head (last seq) and that event's hash, the model and
    config in force (recorded redacted), and the view's size in tokens and items."""

    session_id: str
    created_at: datetime
    model: str | None
    config: Mapping[str, Any]
    metadata: Mapping[str, Any]
    head: int
    last_hash: str
    view_tokens: int
    view_count: int
    #: When the session was erased (its data key destroyed), else None.
    erased_at: datetime | None = None
    #: Whether its content is sealed under a data key of its own (erasable).
    sealed: bool = False
    #: ``(parent session id, parent seq)`` for a fork (its seqs up to that one are the
    #: parent's events); ``None`` for a session of its own.
    parent: tuple[str, int] | None = None


def created_info(
    session_id: str,
    created_at: datetime,
    payload: SessionCreated,
    first_hash: str,
    *,
    sealed: bool,
) -> SessionInfo:
    """The row of a session ``create_session`` just made: its creation event (seq 1,
    hashed ``first_hash``) is its head, its view is empty (every store answers alike)."""
    return SessionInfo(
        session_id,
        created_at,
        payload.model,
        payload.config,
        payload.metadata,
        1,
        first_hash,
        0,
        0,
        sealed=sealed,
    )


@dataclass(frozen=True)
class Checkpoint:
    """A point ``rollback`` can return to: its seq and label (``session.checkpoint``)."""

    seq: int
    label: str | None
    created_at: datetime


@dataclass(frozen=True)
class AppendResult:
    seqs: tuple[int, ...]
    #: True when an idempotency key matched an earlier append: nothing was written.
    duplicate: bool = False
    view_tokens: int = 0
    #: The hash of the last event written ("" for a duplicate): the next append's pin.
    last_hash: str = ""

    @property
    def seq(self) -> int:
        return self.seqs[-1]


@dataclass(frozen=True)
class ViewTail:
    """What a request needs of a view, read without reading the view.

    ``items`` is the view's suffix of at most ``max_tokens`` tokens (starting at a
    message that is not a tool result; one oversized unit may exceed it); ``pinned``
    the items before it that every request keeps (system, critical, summaries) and the
    last human turn; ``before_tokens`` the tokens of the whole view before ``items``.
    """

    items: tuple[ViewItem, ...]
    pinned: tuple[ViewItem, ...]
    before_tokens: int
    head: int


def tail_of(view: Sequence[ViewItem], head: int, max_tokens: int) -> ViewTail:
    """``ViewTail`` of a view held in memory (the reference the SQL version follows)."""
    from contextledger.core.units import is_human_turn, result_ids

    start, size = len(view), 0
    while start > 0 and size + view[start - 1].tokens <= max_tokens:
        start -= 1
        size += view[start].tokens
    while 0 < start < len(view) and (view[start].role == "tool" or result_ids(view[start].message)):
        start -= 1  # a tail never starts inside a tool unit
    human = next((n for n in range(start - 1, -1, -1) if is_human_turn(view[n].message)), None)
    pinned = tuple(
        i
        for n, i in enumerate(view[:start])
        if i.critical or i.kind == "summary" or i.role == "system" or n == human
    )
    before = sum(i.tokens for i in view[:start])
    return ViewTail(tuple(view[start:]), pinned, before, head)


@dataclass(frozen=True)
class RebuildReport:
    """What ``rebuild`` found between the view rows and a fold of the events (and
    whether it repaired them)."""

    session_id: str
    differences: tuple[str, ...] = ()
    repaired: bool = False

    @property
    def ok(self) -> bool:
        """No difference: the stored view is what the events say."""
        return not self.differences


@dataclass(frozen=True)
class Erasure:
    """The audit record of one erasure: no content, only who, what, when and why."""

    session_id: str
    erased_at: datetime
    erased_by: str
    actor: str | None
    reason: str
    events: int
    last_hash: str
    #: Derived rows removed, per kind (view, branch, postings, embeddings).
    removed: Mapping[str, int]

    def to_dict(self) -> dict[str, Any]:
        """The record as JSON-ready values (the CLI's ``--json``, the REST answer)."""
        return {
            "session_id": self.session_id,
            "erased_at": self.erased_at.isoformat(),
            "erased_by": self.erased_by,
            "actor": self.actor,
            "reason": self.reason,
            "events": self.events,
            "last_hash": self.last_hash,
            "removed": dict(self.removed),
        }


@dataclass(frozen=True, slots=True)
class SearchQuery:
    """One recall search (``Store.search_messages``): candidates are the
    ``message.appended`` events of the branch (the current one, or the seqs in ``branch``
    when a replay passes the branch as of its seq) up to ``upto_seq``, minus ``exclude``
    (what the request already carries); ``limit`` matches at most, the query's lexemes
    by ``text_config``."""

    session_id: str
    query: str
    exclude: Collection[int]
    upto_seq: int
    branch: Collection[int] | None
    limit: int
    text_config: str
    head: int | None = None
    hop: bool = False

    @property
    def seq(self) -> int:
        """The request's seq: the head the caller knows (the search may be anchored
        before it, at its query: ``core.recall.query_anchor``)."""
        return self.upto_seq if self.head is None else max(self.head, self.upto_seq)

    def moved_past(self, branch_base: int) -> bool:
        """Whether a live search's branch was replaced after the request's seq (the seq
        of the last rollback or clear is ``branch_base``): ``BranchMoved``."""
        return self.branch is None and branch_base > self.seq


class BranchMoved(ConcurrencyError):
    """A live search found the session's branch replaced (a rollback, a clear) after the
    request's seq: its candidates would be the new branch's, not the branch the request
    was planned on, and ``request_at`` could not rebuild the block. The request path
    builds the request again on the session as it is now; a caller sees it only when
    that happened ``MAX_REBUILDS`` times over (retryable)."""

    def __init__(self, session_id: str) -> None:
        super().__init__(
            f"session {session_id!r}: its branch was replaced (a rollback or a clear by "
            "another writer) while each try of this request was built; build it again",
            session_id=session_id,
        )


class Store(abc.ABC):
    """Persistence for sessions, their events and the inline projection."""

    kind: str = "abstract"
    #: Whether a search runs while the caller goes on (a server does the work): the
    #: request path then starts recall's search before the request (an in-process
    #: search would only run at the caller's next wait, on the same thread).
    concurrent_search: bool = False

    @abc.abstractmethod
    async def create_session(
        self, session_id: str, payload: SessionCreated, *, created_at: datetime
    ) -> SessionInfo:
        """Write seq 1 (``session.created``); ``SessionExists`` if the id is taken."""

    @abc.abstractmethod
    async def fork_session(
        self,
        session_id: str,
        parent_id: str,
        parent_seq: int,
        *,
        created_at: datetime,
        metadata: Mapping[str, Any],
    ) -> SessionInfo:
        """Create ``session_id`` as a fork of ``parent_id`` right after ``parent_seq``.

        Writes one ``session.forked`` event (seq ``parent_seq + 1``, chained onto the
        parent's hash at ``parent_seq``) and no copy of the parent's events: the fork's
        seqs ``1..parent_seq`` are read from the parent. ``SessionExists`` if the id is
        taken, ``SessionNotFound`` without the parent, ``SeqOutOfRange`` outside
        ``1..parent head``.
        """

    @abc.abstractmethod
    async def forks(self, session_id: str) -> list[str]:
        """The ids of the sessions forked directly from ``session_id``, sorted."""

    @abc.abstractmethod
    async def session_info(self, session_id: str) -> SessionInfo:
        """Head, last hash, model, config and view totals; ``SessionNotFound`` if absent."""

    @abc.abstractmethod
    async def list_sessions(
        self, *, after: tuple[datetime, str] | None = None, limit: int | None = None
    ) -> list[SessionInfo]:
        """Sessions oldest first (creation time, then id): those after ``after`` (the
        ``(created_at, session_id)`` a page ended at), ``limit`` at most."""

    @abc.abstractmethod
    async def append(
        self,
        session_id: str,
        payloads: Sequence[Payload],
        *,
        created_at: datetime,
        expected_seq: int | None = None,
        idempotency_key: str | None = None,
        known: tuple[int, str] | None = None,
    ) -> AppendResult:
        """Append ``payloads`` as consecutive events, all or none, in one transaction.

        The pure step ``core.projection.record_events`` decides seqs, hashes and the new
        view; the store persists exactly that. ``expected_seq`` must equal the head
        (else ``ConcurrencyError``); a reused ``idempotency_key`` for the same payload
        returns the original result with ``duplicate=True`` and writes nothing
        (``IdempotencyConflict`` for a different payload). ``known`` = (seq, hash) the
        caller's handle last saw: the append is refused (``SessionNotFound``) unless the
        chain still passes through it, so a stale handle never writes onto a re-created
        session.
        """

    @abc.abstractmethod
    async def read_view(self, session_id: str) -> tuple[ViewItem, ...]:
        """The working view: the current generation's rows plus the message tail; O(view)."""

    async def read_view_tail(self, session_id: str, max_tokens: int) -> ViewTail:
        """The view's last ``max_tokens`` tokens and the pinned items before them."""
        info = await self.session_info(session_id)
        return tail_of(await self.read_view(session_id), info.head, max_tokens)

    @abc.abstractmethod
    async def read_branch(self, session_id: str) -> list[dict[str, Any]]:
        """The current branch's messages, uncompacted and without summaries (copies)."""

    @abc.abstractmethod
    async def branch_seq(self, session_id: str, index: int) -> int | None:
        """The seq of the event that put the branch's ``index``-th message (0-based) there,
        or None past its end: from the branch index, without reading the messages."""

    @abc.abstractmethod
    async def branch_seqs(self, session_id: str) -> list[int]:
        """The seqs behind the current branch's messages, in order (each ``messages.replaced``
        once, for its first message): its index only, no message read."""

    @abc.abstractmethod
    def read_events(
        self, session_id: str, from_seq: int = 1, to_seq: int | None = None
    ) -> AsyncIterator[Event]:
        """Events ``from_seq..to_seq`` in seq order, data as stored (paged under the hood)."""

    @abc.abstractmethod
    async def checkpoints(self, session_id: str) -> list[Checkpoint]:
        """The session's ``checkpoint.created`` events, oldest first."""

    # -- recall (see contextledger.recall) ----------------------------------------------
    #: Candidates are the ``message.appended`` events of the branch (the current one, or
    #: the seqs in ``branch`` when a replay passes the branch as of its seq) up to
    #: ``upto_seq``, minus ``exclude`` (what the request already carries).

    async def search_messages(
        self,
        session_id: str,
        query: str,
        *,
        exclude: Collection[int],
        upto_seq: int,
        branch: Collection[int] | None,
        limit: int,
        text_config: str,
        head: int | None = None,
        hop: bool = False,
    ) -> tuple[list[tuple[int, float]], list[Recalled]]:
        """``(seq, score)`` of the best lexical matches for ``query``, best first, ties
        by seq (newest first), and the matched messages with their neighbours (what a
        request's recall reads, which a store may answer in one round trip). ``head``:
        the seq of the request the search is for, when it is later than ``upto_seq`` (a
        search taken at the request's question); a live search, so the store may know
        it is unchanged since it last searched. ``hop``: a second hop follows the
        matches (``lexical.hop_lexemes``); what it finds comes after them with negated
        scores. A store implements ``find`` (or only ``matches``)."""
        return await self.find(
            SearchQuery(session_id, query, exclude, upto_seq, branch, limit, text_config, head, hop)
        )

    async def search(self, session_id: str, query: str, **options: Any) -> list[tuple[int, float]]:
        """The matches of ``search_messages`` alone (same arguments)."""
        return (await self.search_messages(session_id, query, **options))[0]

    async def find(self, q: SearchQuery) -> tuple[list[tuple[int, float]], list[Recalled]]:
        """``search_messages``'s answer: ``matches`` and, read by ``recall_messages``, their
        messages and the neighbours of the best (``lexical.neighbours``)."""
        found = await self.matches(q)
        if not found:
            return found, []
        from contextledger.store.lexical import neighbours

        seqs = [seq for seq, _ in found]
        near = neighbours([seq for seq, score in found if score > 0], q.upto_seq, q.exclude)
        near = [n for n in near if n not in set(seqs)]
        read = await self.recall_messages(
            q.session_id, seqs + near, upto_seq=q.upto_seq, branch=q.branch
        )
        return found, read

    async def matches(self, q: SearchQuery) -> list[tuple[int, float]]:
        """The lexical matches of ``q`` (see ``search_messages``). A store without search
        recalls nothing."""
        return []

    async def wait_indexed(self, session_id: str | None = None, *, store: bool = True) -> None:
        """Until what the searches so far indexed off their requests is stored (``store``
        False: only what is being stored; a store that indexes as it searches, or not at
        all, has nothing to wait for)."""
        return None

    async def vectors_available(self) -> bool:
        """Whether this store keeps embeddings (PostgreSQL with the ``vector`` extension)."""
        return False

    async def unembedded(
        self, session_id: str, model: str, *, upto_seq: int, first: Collection[int], limit: int
    ) -> list[Recalled]:
        """Branch messages up to ``upto_seq`` with no ``model`` embedding yet: ``first``
        (e.g. the latest turn) before the rest, newest first, at most ``limit``."""
        return []

    async def store_embeddings(
        self,
        session_id: str,
        model: str,
        available_from: int,
        vectors: Sequence[tuple[Recalled, Sequence[float]]],
    ) -> None:
        """Keep each message's vector (the message as ``unembedded`` read it), usable by
        requests (and replays) at seqs ``>= available_from``; an event keeps its first
        embedding. Kept only where the event at that seq still holds that message (a
        session purged and made again under its id meanwhile holds others)."""
        raise NotImplementedError("this store keeps no embeddings (vectors_available)")

    async def store_embeddings_behind(
        self, session_id: str, model: str, vectors: Sequence[tuple[Recalled, Sequence[float]]]
    ) -> bool:
        """``store_embeddings`` for work done off the request path: usable from the seq
        after the session's head, which no append moves until they are stored (a request
        at a seq the head had reached never sees them, nor does its replay; a request
        after it does). False, nothing stored, when the session is gone."""
        raise NotImplementedError("this store keeps no embeddings (vectors_available)")

    async def vector_search(
        self,
        session_id: str,
        model: str,
        query_seq: int,
        *,
        exclude: Collection[int],
        upto_seq: int,
        branch: Collection[int] | None,
        limit: int,
    ) -> list[tuple[int, float]]:
        """``(seq, distance)`` of the candidates nearest the embedding of ``query_seq``."""
        return []

    async def recall_messages(
        self,
        session_id: str,
        seqs: Collection[int],
        *,
        upto_seq: int,
        branch: Collection[int] | None,
    ) -> list[Recalled]:
        """The messages at ``seqs`` that are recall candidates, in seq order."""
        return []

    @abc.abstractmethod
    async def branch_base(self, session_id: str) -> int:
        """The seq of the session's last rollback or clear (0: none). Reads of the live
        branch after a search's own check (the embedder's finds, read seconds later)
        compare it with the request's seq: past it, the branch they read was not the
        request's (``BranchMoved``)."""

    @abc.abstractmethod
    async def rebuild(self, session_id: str, *, repair: bool = True) -> RebuildReport:
        """Fold the events again; report differences from the stored projection and
        (with ``repair``) replace it with the fold's result."""

    @abc.abstractmethod
    async def purge(self, session_id: str, reason: str) -> int:
        """Remove a session entirely, the one audited way: its events go, a record of who
        removed it, when and why stays (``purges``). Returns how many events went;
        ``SessionNotFound`` for an unknown session, ``InvalidArgument`` for a blank reason."""

    @abc.abstractmethod
    async def purges(self) -> list[dict[str, Any]]:
        """The purge records, oldest first: ``session_id``, ``purged_at``, ``purged_by``,
        ``reason``, ``events`` and ``last_hash`` of each purged session."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Release connections; appends in flight are answered first."""

    def connections(self) -> tuple[int, int] | None:
        """``(open, idle)`` database connections of this store (None: it has none)."""
        return None

    async def erase(
        self, session_id: str, reason: str, *, actor: str | None = None
    ) -> list[Erasure]:
        """Destroy the session's data key and every derived plaintext copy (view rows,
        search postings, embeddings, caches); record who erased it, when and why. The
        events stay, sealed, so ``verify`` passes; reads raise ``SessionErased``. The
        forks standing on it go with it, at once (their prefix is its content). Returns
        the audit records: the session's, then its forks', nearest first.
        ``SessionNotEncrypted`` for a session written without a data key (use ``purge``)."""
        raise NotImplementedError(f"the {self.kind} store cannot erase")

    async def erasures(self) -> list[Erasure]:
        """The audit records of every erasure, oldest first."""
        return []

    async def verify(self, session_id: str) -> VerifyReport:
        """Walk the hash chain up to the head read first (``core.chain.verify_chain``)."""
        info = await self.chain_info(session_id)
        # up to the head we read: a writer appending meanwhile is not "extra events"
        events = [e async for e in self.stored_events(session_id, 1, info.head)]
        return verify_chain(session_id, events, info.head, info.last_hash)

    async def chain_info(self, session_id: str) -> SessionInfo:
        """``session_info``, also of an erased session (what ``verify`` walks to)."""
        return await self.session_info(session_id)

    def stored_events(
        self, session_id: str, from_seq: int = 1, to_seq: int | None = None
    ) -> AsyncIterator[Event]:
        """``read_events``, also of an erased session: data as stored (sealed), the
        payload decoded from it (content unreadable without the key)."""
        return self.read_events(session_id, from_seq, to_seq)
