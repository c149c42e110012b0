"""``memory://``: the same pure core with dicts for tables (tests, graceful degradation).

Events are still hashed and folded exactly as in PostgreSQL, so a session that
degrades to memory behaves the same; it just does not survive the process.
"""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from contextledger.core.chain import GENESIS_HASH, Seal, make_event
from contextledger.core.events import (
    CheckpointCreated,
    Event,
    MessageAppended,
    Payload,
    SessionCreated,
    SessionForked,
    decode,
)
from contextledger.core.projection import (
    ViewState,
    apply,
    check_append_target,
    compare_rows,
    fold,
    message_item,
    record_events,
)
from contextledger.core.recall import Recalled, message_text, speaker
from contextledger.core.view import ViewItem
from contextledger.errors import (
    IdempotencyConflict,
    InvalidArgument,
    SeqOutOfRange,
    SessionErased,
    SessionExists,
    SessionHasForks,
    SessionNotEncrypted,
    SessionNotFound,
)
from contextledger.store.base import (
    AppendResult,
    BranchMoved,
    Checkpoint,
    Erasure,
    RebuildReport,
    SearchQuery,
    SessionInfo,
    Store,
    created_info,
)
from contextledger.store.postings import Branch, Postings
from contextledger.store.sealing import KeyRing, Sealer

if TYPE_CHECKING:
    from contextledger.store.lexical import Lexer


def indexed_text(message: Mapping[str, Any]) -> str:
    """What recall indexes of a message: its text and, as PostgreSQL's index has it (every
    string of the message but its role), its participant's name."""
    name = speaker(message)
    text = message_text(message)
    return text if name is None else f"{name}\n{text}"


@dataclass
class _Index:
    """Recall's index of a session for one text configuration (``postings.Postings``),
    with the lexer that fills it."""

    text_config: str
    postings: Postings = field(default_factory=Postings)
    _lexer: Lexer | None = field(default=None, repr=False, compare=False)

    def lex(self, text: str) -> list[str]:
        """``lexical.tokenize`` with this index's vocabulary (each word stemmed once)."""
        if self._lexer is None:
            from contextledger.store.lexical import Lexer

            self._lexer = Lexer(self.text_config)
        return self._lexer(text)

    def add(self, seq: int, text: str) -> None:
        counts: dict[str, int] = {}
        for term in self.lex(text):
            counts[term] = counts.get(term, 0) + 1
        self.postings.add(seq, counts, min(sum(counts.values()), 32767))


@dataclass
class _Stream:
    info: SessionInfo
    events: list[Event] = field(default_factory=list)
    state: ViewState = field(default_factory=ViewState)
    keys: dict[str, int] = field(default_factory=dict)
    #: The branch and view as lists, so a plain append is O(1) (``state`` holds tuples
    #: and is rebuilt from these only when a cold-path event needs the pure fold).
    branch: list[ViewItem] = field(default_factory=list)
    view: list[ViewItem] = field(default_factory=list)
    stale: bool = False  # the lists grew since ``state`` was built
    #: recall's index per text configuration, and the branch's message seqs (kept in step
    #: with ``branch`` as it grows; rebuilt when a cold-path event replaces the list)
    search: dict[str, _Index] = field(default_factory=dict)
    branch_seqs: set[int] = field(default_factory=set)
    #: the seq of the last event that replaced the branch (a rollback, a clear: as
    #: PostgreSQL's ``sessions.branch_base``): a live search past it finds it moved
    branch_base: int = 0
    _branch_of: list[ViewItem] | None = None
    _branch_seen: int = 0

    def on_branch(self) -> set[int]:
        """The seqs of the messages on the branch (what recall may bring back)."""
        if self._branch_of is not self.branch:
            self._branch_of, self._branch_seen, self.branch_seqs = self.branch, 0, set()
        for item in self.branch[self._branch_seen :]:
            if item.ref[1] == 0 and item.kind != "summary":
                self.branch_seqs.add(item.seq)
        self._branch_seen = len(self.branch)
        return self.branch_seqs

    def indexed(self, text_config: str, upto_seq: int) -> _Index:
        """Recall's index for ``text_config``, extended to the events up to ``upto_seq``
        (each message tokenized once, when a search first needs it)."""
        index = self.search.get(text_config)
        if index is None:
            index = self.search[text_config] = _Index(text_config)
        held = index.postings
        for event in self.events[held.upto : max(held.upto, upto_seq)]:
            if isinstance(event.payload, MessageAppended):
                index.add(event.seq, indexed_text(event.payload.message))
            held.upto = event.seq
        return index

    def current(self) -> ViewState:
        if self.stale:
            self.state = replace(self.state, branch=tuple(self.branch), view=tuple(self.view))
            self.stale = False
        return self.state

    def adopt(self, state: ViewState) -> None:
        self.state, self.stale = state, False
        self.branch, self.view = list(state.branch), list(state.view)


def _creation(info: SessionInfo) -> tuple[datetime, str]:
    """The listing order, as PostgreSQL's: creation time, then id."""
    return info.created_at, info.session_id


class MemoryStore(Store):
    kind = "memory"

    def __init__(self, *, keyring: KeyRing | None = None) -> None:
        self._streams: dict[str, _Stream] = {}
        self._purges: list[dict[str, Any]] = []
        #: With a keyring, each new session's content is sealed under a data key of its
        #: own, kept here (in memory: nothing to wrap); erasing drops it.
        self._keyring = keyring
        self._sealers: dict[str, Sealer] = {}
        #: Erased sessions: their sealed events and chain, nothing readable.
        self._erased: dict[str, _Stream] = {}
        self._erasures: list[Erasure] = []

    async def erase(
        self, session_id: str, reason: str, *, actor: str | None = None
    ) -> list[Erasure]:
        """As PostgreSQL's: the session and every fork standing on it (their prefix is
        its content), each with an audit row; all checked before any is erased."""
        if not reason.strip():
            raise InvalidArgument("an erasure needs a non-blank reason", field="reason")
        self._get(session_id)
        forks = self._descendants(session_id)
        for sid in (session_id, *forks):
            if sid not in self._sealers:
                raise SessionNotEncrypted(
                    f"session {sid!r} was written without a data key: it cannot be "
                    "erased by destroying one. Remove it with the audited purge "
                    f"(`contextledger purge {sid} --reason ...`).",
                    session_id=sid,
                )
        why = f"{reason} (a fork of {session_id!r}, erased with it)"
        return [
            self._erase_one(session_id, reason, actor),
            *(self._erase_one(fork, why, actor) for fork in forks),
        ]

    def _descendants(self, session_id: str) -> list[str]:
        """The live forks standing on ``session_id``, theirs, and so on, nearest first."""
        found: list[str] = []
        level = {session_id}
        while level:
            level = {
                sid
                for sid, s in self._streams.items()
                if s.info.parent is not None and s.info.parent[0] in level
            }
            found.extend(sorted(level))
        return found

    def _erase_one(self, session_id: str, reason: str, actor: str | None) -> Erasure:
        stream = self._get(session_id)
        del self._sealers[session_id]
        # keep only what was stored: sealed data, hashes; the payloads are decoded from
        # the sealed data, so no plaintext stays reachable from the store
        sealed = [
            replace(e, payload=decode(e.type, e.version, e.data or {})) for e in stream.events
        ]
        removed = {
            "view": len(stream.view),
            "branch": len(stream.branch),
            "postings": sum(p.postings.size for p in stream.search.values()),
            "embeddings": 0,
        }
        now = datetime.now(UTC)
        info = replace(stream.info, erased_at=now, config={}, metadata={})
        self._erased[session_id] = _Stream(info, sealed)
        del self._streams[session_id]
        receipt = Erasure(
            session_id, now, "memory", actor, reason, len(sealed), info.last_hash, removed
        )
        self._erasures.append(receipt)
        return receipt

    async def erasures(self) -> list[Erasure]:
        return list(self._erasures)

    async def chain_info(self, session_id: str) -> SessionInfo:
        if session_id in self._erased:
            return self._erased[session_id].info
        return await self.session_info(session_id)

    async def stored_events(
        self, session_id: str, from_seq: int = 1, to_seq: int | None = None
    ) -> AsyncIterator[Event]:
        stream = self._erased.get(session_id) or self._get(session_id)
        for event in list(stream.events):
            if event.seq >= from_seq and (to_seq is None or event.seq <= to_seq):
                yield event

    async def purge(self, session_id: str, reason: str) -> int:
        """The audited purge, as PostgreSQL's: the session goes, the record of it stays."""
        if not reason.strip():
            raise InvalidArgument("a purge needs a non-blank reason", field="reason")
        if session_id in self._erased:  # an erased session may still be purged
            stream = self._erased.pop(session_id)
        else:
            stream = self._get(session_id)
            forks = await self.forks(session_id)
            if forks:
                raise SessionHasForks(
                    f"session {session_id!r} has forks standing on it ({', '.join(forks)}): "
                    "purge them first",
                    session_id=session_id,
                    forks=forks,
                )
            del self._streams[session_id]
            self._sealers.pop(session_id, None)
        self._purges.append(
            {
                "session_id": session_id,
                "purged_at": datetime.now(UTC),
                "purged_by": "memory",
                "reason": reason,
                "events": len(stream.events),
                "last_hash": stream.info.last_hash,
            }
        )
        return len(stream.events)

    async def purges(self) -> list[dict[str, Any]]:
        """Who removed which session, when and why (this process's, oldest first)."""
        return [dict(p) for p in self._purges]

    def _get(self, session_id: str) -> _Stream:
        try:
            return self._streams[session_id]
        except KeyError:
            if session_id in self._erased:
                raise SessionErased(
                    f"session {session_id!r} was erased: its content is gone for good",
                    session_id=session_id,
                ) from None
            raise SessionNotFound.for_session(session_id) from None

    async def create_session(
        self, session_id: str, payload: SessionCreated, *, created_at: datetime
    ) -> SessionInfo:
        if session_id in self._streams or session_id in self._erased:
            raise SessionExists(f"session {session_id!r} already exists", session_id=session_id)
        if self._keyring is not None:
            sealer, _, _ = self._keyring.new_key(tenant="local", session_id=session_id)
            self._sealers[session_id] = sealer
        event = make_event(session_id, 1, payload, GENESIS_HASH, created_at=created_at)
        event = replace(event, data=copy.deepcopy(event.payload.to_data()), position=1)
        state = apply(ViewState(), event)
        info = created_info(
            session_id, created_at, payload, event.hash, sealed=self._keyring is not None
        )
        self._streams[session_id] = _Stream(info, [event], state)
        return info

    async def fork_session(
        self,
        session_id: str,
        parent_id: str,
        parent_seq: int,
        *,
        created_at: datetime,
        metadata: Mapping[str, Any],
    ) -> SessionInfo:
        """The parent's events up to ``parent_seq`` are shared (the list holds the same
        immutable ``Event`` objects, as PostgreSQL reads them from the parent's rows).
        An erased id is taken for good, as ``create_session`` says."""
        if session_id in self._streams or session_id in self._erased:
            raise SessionExists(f"session {session_id!r} already exists", session_id=session_id)
        parent = self._get(parent_id)
        head = parent.state.head
        if not 1 <= parent_seq <= head:
            raise SeqOutOfRange(
                f"cannot fork at seq {parent_seq}: session {parent_id!r} runs 1..{head}",
                seq=parent_seq,
                head=head,
            )
        prefix = parent.events[:parent_seq]
        # at or before the parent's own fork point the seq is an ancestor's event: the
        # fork stands on that ancestor (the same events), as in PostgreSQL
        parent_id = prefix[-1].session_id
        state = parent.current() if parent_seq == head else fold(prefix)
        payload = SessionForked(parent_id, parent_seq, prefix[-1].hash, dict(metadata))
        event = make_event(
            session_id, parent_seq + 1, payload, prefix[-1].hash, created_at=created_at
        )
        event = replace(event, data=copy.deepcopy(payload.to_data()), position=len(prefix) + 1)
        state = apply(state, event)
        info = SessionInfo(
            session_id,
            created_at,
            state.model,
            state.config,
            dict(metadata),
            event.seq,
            event.hash,
            state.view_tokens,
            len(state.view),
            parent=(parent_id, parent_seq),
            sealed=self._keyring is not None,
        )
        stream = _Stream(info, [*prefix, event])
        stream.adopt(state)
        self._streams[session_id] = stream
        if self._keyring is not None:  # its own events sealed under a key of its own
            sealer, _, _ = self._keyring.new_key(tenant="local", session_id=session_id)
            self._sealers[session_id] = sealer
        return info

    async def forks(self, session_id: str) -> list[str]:
        self._get(session_id)
        return sorted(
            sid
            for sid, s in self._streams.items()
            if s.info.parent is not None and s.info.parent[0] == session_id
        )

    async def session_info(self, session_id: str) -> SessionInfo:
        return self._get(session_id).info

    async def list_sessions(
        self, *, after: tuple[datetime, str] | None = None, limit: int | None = None
    ) -> list[SessionInfo]:
        streams = [*self._streams.values(), *self._erased.values()]
        infos = sorted((s.info for s in streams), key=_creation)
        if after is not None:
            infos = [i for i in infos if _creation(i) > after]
        return infos if limit is None else infos[:limit]

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
        stream = self._get(session_id)
        if idempotency_key is not None and idempotency_key in stream.keys:
            seq = stream.keys[idempotency_key]
            original = stream.events[seq - 1]
            if original.payload != payloads[-1]:
                raise IdempotencyConflict(
                    f"idempotency key {idempotency_key!r} was used for a different event "
                    f"(seq {seq})",
                    seq=seq,
                )
            return AppendResult((seq,), True, stream.info.view_tokens)
        check_append_target(
            session_id,
            head=stream.state.head,
            last_hash=stream.info.last_hash,
            known=known,
            hash_at_known=(
                stream.events[known[0] - 1].hash
                if known is not None and 0 < known[0] <= len(stream.events)
                else None
            ),
            expected_seq=expected_seq,
        )
        sealer = self._sealers.get(session_id)
        seal = sealer.seal if sealer is not None else None
        if all(isinstance(p, MessageAppended) for p in payloads):
            events = self._append_messages(stream, payloads, created_at, idempotency_key, seal)
        else:
            step = record_events(
                stream.current(),
                session_id,
                stream.info.last_hash,
                payloads,
                created_at=created_at,
                idempotency_key=idempotency_key,
                state_at=lambda seq: fold(stream.events, until=seq),
                seal=seal,
            )
            events = list(step.events)
            stream.adopt(step.state)
            if step.branch_reset:
                stream.branch_base = events[-1].seq
        for event in events:
            stream.events.append(
                replace(
                    event,
                    data=(
                        event.data
                        if event.data is not None
                        else copy.deepcopy(event.payload.to_data())
                    ),
                    position=len(stream.events) + 1,
                )
            )
        if idempotency_key is not None:
            stream.keys[idempotency_key] = events[-1].seq
        plain = all(isinstance(e.payload, MessageAppended) for e in events)
        stream.info = replace(
            stream.info,
            head=stream.state.head,
            last_hash=events[-1].hash,
            view_tokens=(
                stream.info.view_tokens + sum(e.tokens for e in events)
                if plain
                else sum(i.tokens for i in stream.view)
            ),
            view_count=len(stream.view),
            config=stream.state.config,
            model=stream.state.model,
        )
        return AppendResult(
            tuple(e.seq for e in events), False, stream.info.view_tokens, events[-1].hash
        )

    @staticmethod
    def _append_messages(
        stream: _Stream,
        payloads: Sequence[Payload],
        created_at: datetime,
        key: str | None,
        seal: Seal | None = None,
    ) -> list[Event]:
        """The fast path, as in PostgreSQL: hash, then add each item to branch and view."""
        events: list[Event] = []
        prev, seq = stream.info.last_hash, stream.state.head
        for n, payload in enumerate(payloads):
            assert isinstance(payload, MessageAppended)
            seq += 1
            event = make_event(
                stream.info.session_id,
                seq,
                payload,
                prev,
                created_at=created_at,
                idempotency_key=key if n == len(payloads) - 1 else None,
                seal=seal,
            )
            item = message_item(seq, payload)
            stream.branch.append(item)
            stream.view.append(item)
            events.append(event)
            prev = event.hash
        stream.state = replace(stream.state, head=seq)
        stream.stale = True
        return events

    async def read_view(self, session_id: str) -> tuple[ViewItem, ...]:
        # copies, as PostgreSQL's freshly decoded rows are: callers cannot reach the ledger
        return tuple(
            replace(i, message=copy.deepcopy(i.message)) for i in self._get(session_id).view
        )

    async def read_branch(self, session_id: str) -> list[dict[str, Any]]:
        return [copy.deepcopy(dict(i.message)) for i in self._get(session_id).branch]

    async def branch_seq(self, session_id: str, index: int) -> int | None:
        branch = self._get(session_id).branch
        return branch[index].seq if 0 <= index < len(branch) else None

    async def branch_seqs(self, session_id: str) -> list[int]:
        return [i.seq for i in self._get(session_id).branch if i.ref[1] == 0]

    async def read_events(
        self, session_id: str, from_seq: int = 1, to_seq: int | None = None
    ) -> AsyncIterator[Event]:
        for event in list(self._get(session_id).events):
            if event.seq >= from_seq and (to_seq is None or event.seq <= to_seq):
                yield event

    def _allowed(self, stream: _Stream, branch: Collection[int] | None) -> Collection[int]:
        return set(branch) if branch is not None else stream.on_branch()

    async def matches(self, q: SearchQuery) -> list[tuple[int, float]]:
        """PostgreSQL's search, the same rules and code (``postings.search``)."""
        from contextledger.store.postings import search

        stream = self._get(q.session_id)
        if q.moved_past(stream.branch_base):
            raise BranchMoved(q.session_id)  # (see ``request_path.build``)
        # every message indexed (what a search reads stops at its own seq): on a branch
        # that holds them all (no rollback), nothing is checked message by message
        index = stream.indexed(q.text_config, len(stream.events))
        allowed = self._allowed(stream, q.branch)
        whole = q.branch is None and len(allowed) == index.postings.messages
        branch = None if whole else Branch.of(allowed, q.upto_seq)
        return search(
            index.postings,
            index.lex(q.query),
            upto_seq=q.upto_seq,
            exclude=q.exclude,
            on_branch=branch,
            limit=q.limit,
            hop=q.hop,
        )

    async def branch_base(self, session_id: str) -> int:
        return self._get(session_id).branch_base

    async def recall_messages(
        self,
        session_id: str,
        seqs: Collection[int],
        *,
        upto_seq: int,
        branch: Collection[int] | None,
    ) -> list[Recalled]:
        stream = self._get(session_id)
        allowed = self._allowed(stream, branch)
        out: list[Recalled] = []
        for seq in sorted(set(seqs)):
            if not 0 < seq <= min(upto_seq, len(stream.events)) or seq not in allowed:
                continue
            event = stream.events[seq - 1]
            payload = event.payload
            if isinstance(payload, MessageAppended):
                message = copy.deepcopy(dict(payload.message))
                out.append(Recalled(seq, message, payload.tokens, event.created_at))
        return out

    async def checkpoints(self, session_id: str) -> list[Checkpoint]:
        return [
            Checkpoint(e.seq, e.payload.label, e.created_at)
            for e in self._get(session_id).events
            if isinstance(e.payload, CheckpointCreated)
        ]

    async def rebuild(self, session_id: str, *, repair: bool = True) -> RebuildReport:
        stream = self._get(session_id)
        expected = fold(stream.events)
        diffs = compare_rows(expected.view, stream.view, "view") + compare_rows(
            expected.branch, stream.branch, "branch"
        )
        if diffs and repair:
            stream.adopt(expected)
        return RebuildReport(session_id, tuple(diffs), bool(diffs) and repair)

    async def close(self) -> None:
        self._streams.clear()
        self._sealers.clear()  # the data keys go with the process's store
        self._erased.clear()
