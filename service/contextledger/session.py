"""``Session``: one conversation's memory, the async façade over the pure core and a store.

A ``Session`` satisfies the Amplifier ``ContextManager`` protocol (``add_message``,
``get_messages_for_request``, ``get_messages``, ``set_messages``, ``clear``) and
adds the ledger's own verbs: checkpoints, rollback, replay and audit. It is a façade:
the write path lives in ``appends.py``, the request path (planner state, request
views, ``request_at``) in ``request_path.py``, budget and usage in
``session_budget.py``, compaction in ``compactor.py``; each sees the session through
a Protocol. Opening ledgers and sessions lives in ``ledger.py``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any, Literal

import structlog

from contextledger import hooks as hk
from contextledger._checks import check_seq, check_text
from contextledger.appends import WritePath, replacement, summary_payload, utc_now
from contextledger.compactor import Compactor, ManageResult
from contextledger.core.budget import Budget, Usage
from contextledger.core.chain import VerifyReport
from contextledger.core.config import ContextConfig
from contextledger.core.events import (
    CheckpointCreated,
    Event,
    MessageAppended,
    Payload,
    SessionCleared,
)
from contextledger.core.messages import copy_json
from contextledger.core.model_limits import ModelLimits
from contextledger.core.projection import ViewState, fold
from contextledger.core.shapes import PROVIDERS, shape_of
from contextledger.core.tokens import TokenCounter
from contextledger.core.view import ViewItem
from contextledger.errors import CompactionError, ConfigError, InvalidArgument, SessionNotFound
from contextledger.hooks import HookBus, PreCompactHandler
from contextledger.protocols import LedgerHandle
from contextledger.provider_shapes import ProviderRequest, as_message_list, normalize, render
from contextledger.request_path import BUILT_AT, RequestPath
from contextledger.rollback import rollback_event
from contextledger.session_budget import SessionBudget
from contextledger.session_state import SessionState
from contextledger.settings import settings_change
from contextledger.store.base import Checkpoint, SessionInfo
from contextledger.summarizer import FallbackCallback

log = structlog.get_logger(__name__)

FOOTPRINT_FIXED = 64 * 1024
FOOTPRINT_PER_TOKEN = 24
#: ``request_at`` takes the stored view back past at most this many appended messages
#: (read as events) instead of folding the history (``Session._recent_state``).
RECENT_MESSAGES = 256


class Session:
    """One conversation's memory. Obtain it from ``Ledger.session``.

    Satisfies the Amplifier ``ContextManager`` protocol; everything it writes is an
    event in the ledger, everything it reads is a projection of those events.
    """

    def __init__(
        self, ledger: LedgerHandle, info: SessionInfo, config: ContextConfig, counter: TokenCounter
    ) -> None:
        self._ledger = ledger
        self._store = ledger.store
        self.session_id = info.session_id
        #: head, pin, tokens, info, config, ephemeral items: one owner, shared below
        self._state = SessionState.of(ledger, info, config)
        self.counter = counter
        self.hooks = HookBus(forward_to=ledger.hook_target)
        #: Asked before every compaction (manual or auto); may cancel it or supply a summary.
        self.pre_compact: PreCompactHandler | None = ledger.pre_compact
        #: Called as ``on_fallback(from_model, to_model, error)`` when a summarizer model fails.
        self.on_fallback: FallbackCallback | None = None
        self._budget = SessionBudget(self, self._state)
        self._writes = WritePath(self, self._state)
        self._compactor = Compactor(self, self._state, self._writes)
        self._requests = RequestPath(self, self._state, self._compactor, self._writes)
        self._writes.follow(self._requests)

    def __repr__(self) -> str:
        return f"<Session {self.session_id!r} head={self._state.head} store={self._store.kind}>"

    # -- state ------------------------------------------------------------------------

    @property
    def request_seq(self) -> int:
        """The seq the last request view was built at: ``request_at(request_seq)`` gives
        it back exactly, even when a background summary landed right after it. Read in
        the task that built the request, it is that request's, whatever other tasks built
        on the handle meanwhile (the service's clients share one)."""
        built = BUILT_AT.get()
        if built is not None and built[0] is self._requests:
            return built[1]
        return self._requests.request_seq

    @property
    def head(self) -> int:
        """The last seq this process wrote or read (``refresh`` re-reads it)."""
        return self._state.head

    @property
    def model(self) -> str | None:
        """The model in force (as of this process's last write or ``refresh``); it sets
        the tokenizer and the context window."""
        return self._state.info.model

    @property
    def config(self) -> ContextConfig:
        """The session's policy in force (``update_config`` records a change)."""
        return self._state.config

    @property
    def metadata(self) -> Mapping[str, Any]:
        """What the session was created with (``ledger.session(metadata=...)``)."""
        return self._state.info.metadata

    @property
    def footprint(self) -> int:
        """Bytes this handle holds, estimated from its view's tokens: measured with
        tracemalloc at 50-800 messages, ~24 bytes a token (the view's items, their counts,
        the planned and finished request) and ~64 KiB besides. For caches that must bound
        their memory (the service's session cache)."""
        return FOOTPRINT_FIXED + FOOTPRINT_PER_TOKEN * max(0, self._state.view_tokens)

    async def refresh(self) -> SessionInfo:
        """Re-read the session row: head, model and config as another process may have
        moved them. Appends never need it (they are pinned to the chain and refuse a
        moved head by themselves); reads of ``head``/``model``/``config`` do. A session
        purged and created again under its id since is taken as it is now: nothing this
        handle held of the one before is served again."""
        pin = self._state.known
        info = await self._store.session_info(self.session_id)
        rewritten = self._rewritten(info, pin)
        if self._state.known == pin:  # (else this handle wrote while it read: its own)
            await self._take_settings(info, pin)
        self._state.adopt(info)
        if rewritten:
            self._requests.view_changed()
        self._writes.forget_tail()
        self._requests.on_refresh()
        return self._state.info

    async def _follow(self) -> None:
        """The session row as other writers left it, read before a request: the model
        and settings they recorded are taken (the request is built, and replayed, under
        them); another chain under this id (purged and created again) is refused as an
        append refuses it, before anything of the old one is served. A row read while
        this handle itself wrote (another request's append, a background summary) may be
        older than what the handle knows: then only its creation time is compared."""
        pin = self._state.known
        info = await self._store.session_info(self.session_id)
        if self._rewritten(info, pin):
            raise SessionNotFound(
                f"session {self.session_id!r} is not the chain this handle knew (purged and "
                "perhaps re-created): reopen it, or refresh() to take it as it is now",
                session_id=self.session_id,
                known_seq=pin[0],
            )
        if self._state.known != pin:
            return
        await self._take_settings(info, pin)
        if self._state.known == pin:
            self._state.info = info
            self._state.advance(info.head, info.last_hash)

    def _rewritten(self, info: SessionInfo, pin: tuple[int, str]) -> bool:
        """Whether ``info`` is another chain than the one this handle knew: created at
        another time, or no longer through ``pin``, the (seq, hash) it knew when it asked
        for the row (compared only while the pin has not moved since: a row read during
        the handle's own append may be older than the append)."""
        if info.created_at != self._state.info.created_at:
            return True
        if self._state.known != pin:
            return False
        seq, digest = pin
        return info.head < seq or (info.head == seq and info.last_hash != digest)

    async def _take_settings(self, info: SessionInfo, pin: tuple[int, str]) -> None:
        """The config and model ``info`` records, where another handle changed them (a
        config recorded as this handle holds it keeps the in-process keys it has; one
        this release cannot read, a newer one's, leaves the handle's as it is)."""
        config = self._state.config
        try:
            recorded = self._ledger.config_from(info.config)
        except ConfigError as exc:
            log.warning("recorded_config_unreadable", session_id=self.session_id, error=str(exc))
            return
        if recorded.to_dict() != config.to_dict():
            config = recorded
        if config is not self._state.config or info.model != self._state.info.model:
            counter = await self._ledger.warm_counter(info.model, config)
            if self._state.known == pin:  # (not if the handle changed them meanwhile)
                self.counter, self._state.config = counter, config

    async def get_token_count(self) -> int:
        """Tokens in the working view (persisted + ephemeral); O(1), never re-tokenizes."""
        return self._state.view_tokens + sum(i.tokens for i in self._state.ephemeral)

    def limits(self, model: str | None = None) -> ModelLimits:
        """Context window and output limit of ``model`` (default: the session's)."""
        return self._budget.limits(model)

    def budget(
        self,
        token_budget: int | None = None,
        provider: Any | None = None,
        *,
        model: str | None = None,
        max_tokens: int | None = None,
    ) -> Budget:
        """The request budget: explicit, else from the provider, else from the model's limits.

        ``max_tokens`` is the request's output allowance; ``config.max_tokens`` caps
        the context itself (as Amplifier's ``max_tokens`` does). Called with no
        argument, the budget in force: the last request's ``token_budget``, if any.
        """
        if token_budget is None and provider is None and model is None and max_tokens is None:
            token_budget = self._requests.token_budget
        return self._budget.budget(token_budget, provider, model, max_tokens)

    async def usage(self, model: str | None = None, max_tokens: int | None = None) -> Usage:
        """Tokens, budget, fraction and state (healthy/warning/critical/overflow); O(1)."""
        return await self._budget.usage(model, max_tokens)

    # -- writing ----------------------------------------------------------------------

    async def _append(
        self,
        payloads: Sequence[Payload],
        *,
        expected_seq: int | None = None,
        idempotency_key: str | None = None,
    ) -> int:
        """Append ``payloads`` through the write path; the last seq (every writer's door)."""
        return (await self._writes.append(payloads, expected_seq, idempotency_key))[-1]

    async def add_message(
        self,
        message: Mapping[str, Any],
        *,
        critical: bool = False,
        ephemeral: bool = False,
        idempotency_key: str | None = None,
        expected_seq: int | None = None,
    ) -> int | None:
        """Append ``message``; return its seq (``None`` for an ephemeral message).

        ``expected_seq`` is the head the caller believes current: if another writer
        got there first, ``ConcurrencyError`` and nothing is written. A retry with
        the same ``idempotency_key`` returns the original seq and writes nothing.
        A tool call left unanswered when the conversation moves on gets a synthetic
        error result, recorded once, right before this message.

        OpenAI Responses items and Gemini contents are accepted too: they are
        converted to OpenAI chat (a Gemini content with several function results
        becomes one tool message each; the seq returned is the last one's, and
        ``idempotency_key`` / ``expected_seq`` cover them all) and the original is
        recorded beside each converted message (``data.original``).
        """
        self._ledger.check_open()
        original: dict[str, Any] | None = None
        if isinstance(message, Mapping) and shape_of(message) != "openai":
            original = copy_json(dict(message), "message")
            *first, message = await normalize(message)
            for n, part in enumerate(first):  # a retry finds every part by its own key
                key = None if idempotency_key is None else f"{idempotency_key}#{n}"
                pin = expected_seq if n == 0 else None
                await self._add_message(part, critical, ephemeral, key, pin, original)
            if first:
                expected_seq = None  # checked on the first part; the rest follow it
        return await self._add_message(
            message, critical, ephemeral, idempotency_key, expected_seq, original
        )

    async def _add_message(
        self,
        message: Mapping[str, Any],
        critical: bool,
        ephemeral: bool,
        idempotency_key: str | None,
        expected_seq: int | None,
        original: Mapping[str, Any] | None,
    ) -> int | None:
        seq, copied, tokens = await self._writes.add_one(
            message, critical, ephemeral, idempotency_key, expected_seq, original
        )
        if self.hooks.has_listeners(hk.MESSAGE_ADDED):
            await self.hooks.emit(
                hk.MESSAGE_ADDED,
                {
                    "role": copied["role"],
                    "content_length": len(str(copied.get("content") or "")),
                    "tokens": tokens,
                    "seq": seq,
                    "ephemeral": ephemeral,
                    "total_tokens": await self.get_token_count(),
                },
            )
        await self._compactor.maybe_compact()
        return seq

    async def add_messages(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        critical: bool = False,
        idempotency_key: str | None = None,
        expected_seq: int | None = None,
    ) -> list[int]:
        """Append several messages atomically, in one round trip: one seq each, all or none.

        Tool calls left open before the first message get their synthetic results in
        the same batch (as ``add_message`` does). ``expected_seq`` and
        ``idempotency_key`` cover the batch as a whole, as ``add_message``'s cover one
        message: a retry returns the original seqs and writes nothing, and the same key
        for other messages is an ``IdempotencyConflict``.
        """
        seqs = await self._writes.add_batch(messages, critical, idempotency_key, expected_seq)
        if seqs:
            await self._compactor.maybe_compact()
        return seqs

    async def include(
        self, source: str, content: str, *, role: str = "system", ephemeral: bool = False
    ) -> int | None:
        """Inject context from ``source`` (a hook, a retriever) and say so on the bus."""
        if not isinstance(source, str) or not source:
            raise InvalidArgument("include needs a non-empty source name", field="source")
        seq = await self.add_message({"role": role, "content": content}, ephemeral=ephemeral)
        await self.hooks.emit(hk.INCLUDE, {"source": source, "content": content, "seq": seq})
        return seq

    async def set_messages(
        self, messages: Sequence[Mapping[str, Any]], *, expected_seq: int | None = None
    ) -> int:
        """Replace the branch and the view with ``messages`` (session restore).

        ``expected_seq``: the head the caller read; if another writer moved it,
        ``ConcurrencyError`` and nothing is written (as for ``add_message``)."""
        payload = replacement(messages, self.counter, self._state.config.max_message_bytes)
        self._state.ephemeral.clear()
        return await self._append([payload], expected_seq=expected_seq)

    async def branch_seq(self, index: int) -> int | None:
        """The seq of the event that put the branch's ``index``-th message (0-based) there,
        or None past its end; read from the branch index, not from the events. With
        ``request_at`` it answers "what did the request after message ``index`` carry"."""
        if check_seq(index, "index") is None:
            raise InvalidArgument("index must be an int in 0..2**63-1", field="index")
        return await self._store.branch_seq(self.session_id, index)

    async def clear(self) -> int:
        """Empty the view (``session.cleared``); returns its seq. Nothing is deleted: the
        earlier messages stay in the ledger, replayable and verifiable, and a rollback to
        a checkpoint before the clear brings them back into the view."""
        self._state.ephemeral.clear()
        return await self._append([SessionCleared()])

    async def checkpoint(self, label: str | None = None) -> Checkpoint:
        """Mark the current point so ``rollback`` can return to it; returns it.

        ``label`` names it (``rollback("before-deploy")``); it cannot be all digits,
        which ``rollback`` would read as a seq. A label used twice names the latest."""
        if label is not None:
            check_text(label, "label")
        if isinstance(label, str) and label.isdigit():
            raise InvalidArgument(
                "a checkpoint label cannot be all digits (it would read as a seq in rollback)"
            )
        seq = await self._append([CheckpointCreated(label)])
        return Checkpoint(seq, label, utc_now())

    async def checkpoints(self) -> list[Checkpoint]:
        """Every checkpoint of the session, oldest first (rolled-back ones included)."""
        return await self._store.checkpoints(self.session_id)

    async def rollback(self, to: Checkpoint | str | int, *, expected_seq: int | None = None) -> int:
        """Make the view exactly what it was right after a checkpoint (or any seq).

        Events after it stay in the ledger; a rollback can itself be rolled back.
        ``expected_seq``: the head the caller decided the rollback at; if another writer
        moved it, ``ConcurrencyError`` and nothing is written (pop-like callers retry).
        """
        event = await rollback_event(to, self.checkpoints, self.session_id)
        self._state.ephemeral.clear()
        seq = await self._append([event], expected_seq=expected_seq)
        await self.refresh()  # the model and settings in force at the target come back too
        self._state.config = self._ledger.config_from(self._state.info.config)
        self.counter = await self._ledger.warm_counter(self._state.info.model, self._state.config)
        return seq

    async def record_summary(
        self,
        from_seq: int,
        to_seq: int,
        summary: str | Mapping[str, Any],
        *,
        audit: Mapping[str, Any] | None = None,
        role: str = "user",
    ) -> int:
        """Low-level: one summary item replaces the view items positioned in the range."""
        payload = summary_payload(from_seq, to_seq, summary, audit, role, self.counter)
        return await self._append([payload])

    async def update_config(self, config: Mapping[str, Any] | ContextConfig) -> int:
        """Record new settings; replay then knows which were in force at every seq."""
        new = config if isinstance(config, ContextConfig) else self._state.config.merged(config)
        return await self._change(new, None)

    async def set_model(self, model: str) -> int:
        """Switch model: the current view is recounted once with the new counter (an event)."""
        return await self._change(None, check_text(model, "model"))

    async def _change(self, config: ContextConfig | None, model: str | None) -> int:
        """Record a settings and/or model change as one batch: both land, or neither."""
        new_config = config or self._state.config
        counter = await self._ledger.warm_counter(model or self.model, new_config)
        if config is not None:
            self._ledger.remember_secrets(config)
        payloads = await settings_change(self, self._state.store, config, model, counter)
        if not payloads:
            return self._state.head
        seq = await self._append(payloads)
        self._state.config, self.counter = new_config, counter
        await self.refresh()
        return seq

    # -- compaction (decided and recorded by compactor.py) ----------------------------------

    async def compact(
        self,
        strategy: str | None = None,
        *,
        trigger: Literal["manual", "auto"] = "manual",
        token_budget: int | None = None,
    ) -> int:
        """Persist a compaction decision; return the tokens it saved (0: nothing to do).

        A checkpoint (``auto:pre-compact``) is written first, in the same transaction,
        so ``rollback`` to it undoes the compaction; ``view_at`` and ``rebuild`` replay it.
        """
        return await self._compactor.compact(strategy, trigger=trigger, token_budget=token_budget)

    async def manage(self, *, trigger: Literal["manual", "auto"] = "manual") -> ManageResult:
        """Measure the state and apply what it calls for (Vellum's ``manage``)."""
        return await self._compactor.manage(trigger=trigger)

    # -- reading ----------------------------------------------------------------------

    async def view_items(self) -> tuple[ViewItem, ...]:
        """The working view as items (refs, tokens, kinds), ephemeral ones merged in."""
        self._ledger.check_open()
        items = await self._store.read_view(self.session_id)
        if not self._state.ephemeral:
            return items
        return tuple(sorted((*items, *self._state.ephemeral), key=lambda i: i.ord))

    async def view(self) -> list[dict[str, Any]]:
        """The working view: summaries and persisted compactions applied."""
        return [dict(i.message) for i in await self.view_items()]

    async def get_messages(self) -> list[dict[str, Any]]:
        """The current branch's messages in order: no compaction, no summaries."""
        self._ledger.check_open()
        branch = await self._store.read_branch(self.session_id)
        if not self._state.ephemeral:
            return branch
        return branch + [dict(i.message) for i in self._state.ephemeral]

    async def get_messages_for_request(
        self, token_budget: int | None = None, provider: Any | None = None, *, in_force: bool = True
    ) -> list[dict[str, Any]]:
        """Messages for the next request: within budget, valid for the provider.

        Plan, fit, finish. The plan is kept in the process and updated by each append
        (``core/compaction/request.py``): no read when nothing changed, just the new
        events when another writer appended, O(budget) whatever the history. Compaction
        here is ephemeral (nothing is written); the cut moves rarely, so the prompt
        prefix stays stable, and it is a pure function of the view, so ``request_at``
        replays it exactly. With the ``summarize`` strategy, crossing the threshold
        starts a rolling summary in the background; requests use it once recorded.

        ``provider`` is a provider object (its model and limits set the budget and
        the finishing touches) or a shape name: ``"openai"`` (the default shape),
        ``"anthropic"`` (tool calls as ``tool_use`` and results as ``tool_result``
        blocks, turns merged to alternate) or ``"gemini"`` (role ``model``,
        ``parts``). For those two the system prompt, when there is one, comes first
        as ``{"role": "system", "content": text}``: pass it as ``system=`` (or use
        ``request_for(provider)``, which returns it separately).

        ``token_budget`` becomes the budget in force (``budget()``, ``usage()``,
        auto-compaction, a replay's default) unless ``in_force`` is False: a handle
        shared between clients (the service's) keeps one client's budget to its call.
        """
        if isinstance(provider, str):
            return as_message_list(await self.request_for(provider, token_budget))
        return await self._requests.build(token_budget, provider, in_force=in_force)

    async def close(self, wait_seconds: float = 30.0) -> None:
        """Wait for a summary in flight (up to ``wait_seconds``), else cancel it, and for a
        recall search started ahead of the next request."""
        await self._requests.close(wait_seconds)
        await self._compactor.wait(wait_seconds)

    @property
    def summary_failure(self) -> CompactionError | None:
        """The last background summary that failed (typed); ``None`` once one succeeds."""
        return self._compactor.summary_failure

    async def request_for(self, provider: str, token_budget: int | None = None) -> ProviderRequest:
        """The request view in ``provider``'s shape (``openai``, ``anthropic``, ``gemini``)
        with the system prompt separate; converted by litellm, off the event loop."""
        if provider not in PROVIDERS:
            raise InvalidArgument(
                f"provider must be one of {PROVIDERS} or a provider object, got {provider!r}",
                field="provider",
            )
        messages = await self.get_messages_for_request(token_budget)
        return await render(messages, provider, self.model)

    def events(self, from_seq: int = 1, to_seq: int | None = None) -> AsyncIterator[Event]:
        """The session's events in seq order (an async iterator; pages under the hood)."""
        self._ledger.check_open()
        check_seq(from_seq, "from_seq")
        check_seq(to_seq, "to_seq")
        return self._store.read_events(self.session_id, from_seq, to_seq)

    async def _fold_to(self, seq: int) -> ViewState:
        if isinstance(seq, bool) or not isinstance(seq, int) or not 1 <= seq <= self._state.head:
            await self.refresh()
            if (
                isinstance(seq, bool)
                or not isinstance(seq, int)
                or not 1 <= seq <= self._state.head
            ):
                raise InvalidArgument(f"seq must be an int in 1..{self._state.head}")
        return fold([e async for e in self._store.read_events(self.session_id, 1, seq)])

    async def view_at(self, seq: int) -> list[dict[str, Any]]:
        """The working view right after ``seq`` (replayed from the events)."""
        return [dict(i.message) for i in (await self._fold_to(seq)).view]

    async def request_at(
        self, seq: int, provider: Any | None = None, *, token_budget: int | None = None
    ) -> list[dict[str, Any]]:
        """What a request built right after ``seq`` carried: the replayed view, planned
        for the same budget (default: the budget in force) with the settings in force at
        ``seq``, with its recall block (searched as of ``seq``, on the branch as of
        ``seq``), finished for the provider. Ephemeral messages are not in the ledger;
        replays never call a model or an embedder."""
        recent = await self._recent_state(seq)
        if recent is not None:
            state, branch = recent
            return await self._requests.replay(
                state, seq, provider, token_budget, branch_seqs=branch
            )
        state = await self._fold_to(seq)
        return await self._requests.replay(state, seq, provider, token_budget)

    async def _recent_state(self, seq: int) -> tuple[ViewState, list[int]] | None:
        """The state right after ``seq`` and its branch's seqs without folding the history,
        when at most ``RECENT_MESSAGES`` messages were appended since and nothing else
        (a resent request's usual case: its reply came after): the stored view without
        those messages, which are its tail, and the branch index up to ``seq``. None
        otherwise (another event since, a fork, a write meanwhile, a seq out of range):
        the caller folds."""
        if isinstance(seq, bool) or not isinstance(seq, int) or seq < 1:
            return None
        store, sid = self._store, self.session_id
        info = await store.session_info(sid)
        if info.parent is not None or not 0 <= info.head - seq <= RECENT_MESSAGES:
            return None
        later = [e async for e in store.read_events(sid, seq + 1, info.head)]
        if len(later) != info.head - seq or not all(
            isinstance(e.payload, MessageAppended) for e in later
        ):
            return None
        view = await store.read_view(sid)
        branch = await store.branch_seqs(sid)
        now = await store.session_info(sid)
        if (now.head, now.last_hash) != (info.head, info.last_hash):
            return None  # written meanwhile: the view read may be another head's
        kept = len(view) - len(later)
        if kept < 0 or [i.ref for i in view[kept:]] != [(e.seq, 0) for e in later]:
            return None
        state = ViewState(head=seq, view=view[:kept], model=info.model, config=info.config)
        return state, [b for b in branch if b <= seq]

    async def verify(self) -> VerifyReport:
        """Recompute the session's hash chain from its first event: ``report.ok``, or the
        first bad seq and why; a fork's covers the parent prefix it stands on. It reads
        every event (O(history)); a chain whose tail was cut needs an anchor kept
        elsewhere (``ledger.verify(id, anchor=...)``)."""
        return await self._store.verify(self.session_id)

    async def fork(
        self,
        new_id: str,
        at: Checkpoint | str | int | None = None,
        *,
        metadata: Mapping[str, Any] | None = None,
    ) -> Session:
        """A new session ``new_id`` standing on this one at ``at`` (a ``Checkpoint``, a
        label, a seq; default the head): one pointer event, nothing copied. Its view is
        ``view_at(seq)`` of this session, item for item; this session goes on unaffected
        (``Ledger.fork``)."""
        forked: Session = await self._ledger.fork(self.session_id, new_id, at=at, metadata=metadata)
        return forked

    @property
    def parent(self) -> tuple[str, int] | None:
        """``(parent session id, seq)`` this session was forked from, if it is a fork."""
        return self._state.info.parent
