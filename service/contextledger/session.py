"""``Ledger`` and ``Session``: the async API that glues the pure core to a store.

A ``Session`` satisfies the Amplifier ``ContextManager`` protocol (``add_message``,
``get_messages_for_request``, ``get_messages``, ``set_messages``, ``clear``) and
adds the ledger's own verbs: checkpoints, rollback, replay and audit.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator, Awaitable, Callable, Generator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

import structlog

from . import hooks as hk
from .budget import Budget, Usage, budget_for, budget_from_provider, thresholds_for, usage
from .compaction import RequestState, plan, plan_request, prune_tool_outputs
from .compaction.finish import bridge_cost, bridge_reserve, finish_request_view
from .compaction.select import select_for_summary
from .config import REDACTED, ContextConfig
from .errors import (
    CheckpointNotFound,
    CompactionError,
    ConcurrencyError,
    InvalidArgument,
    InvalidMessage,
    LedgerClosed,
    SessionExists,
    SessionNotFound,
)
from .events import (
    CheckpointCreated,
    CompactionApplied,
    ConfigChanged,
    Event,
    MessageAppended,
    MessagesReplaced,
    ModelChanged,
    Payload,
    Pruned,
    RolledBack,
    SessionCleared,
    SessionCreated,
    SummaryRecorded,
)
from .hooks import CompactContext, CompactDecision, HookBus, PreCompactHandler
from .ledger.dsn import is_postgres, redact
from .ledger.memory import MemoryStore
from .ledger.store import Checkpoint, RebuildReport, SessionInfo, Store, VerifyReport
from .messages import copy_json, validate_message
from .models import ModelLimits, model_limits
from .projection import fold
from .tokens import TokenCounter, get_counter
from .units import group_units, result_ids, synthetic_results, tool_calls
from .view import ORD_STRIDE, ViewItem

log = structlog.get_logger(__name__)
MAX_SESSION_ID = 200


def _now() -> datetime:
    return datetime.now(UTC)


MAX_TOKENS = 2**31 - 1  # the ledger's token columns are 32-bit
MAX_SEQ = 2**63 - 1


def _check_text(value: Any, name: str, *, limit: int = 200) -> str:
    """A short identifier: non-empty, printable to UTF-8, no NUL (PostgreSQL text)."""
    if not isinstance(value, str) or not value.strip() or len(value) > limit or "\x00" in value:
        raise InvalidArgument(f"{name} must be a non-empty string of at most {limit} "
                              "characters, without NUL", field=name)
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidArgument(f"{name} is not valid Unicode", field=name) from None
    return value


def _check_session_id(session_id: Any) -> str:
    return _check_text(session_id, "session_id", limit=MAX_SESSION_ID)


def _check_key(key: Any) -> str | None:
    return None if key is None else _check_text(key, "idempotency_key")


def _check_seq(value: Any, name: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_SEQ:
        raise InvalidArgument(f"{name} must be an int in 0..2**63-1", field=name)
    return value


def _check_mapping(value: Any, name: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InvalidArgument(f"{name} must be a dict, not {type(value).__name__}", field=name)
    try:
        copied: dict[str, Any] = copy_json(dict(value), name)
    except InvalidMessage as exc:
        raise InvalidArgument(str(exc.args[0]), field=name) from None
    return copied


def _checked_tokens(tokens: int) -> int:
    if tokens > MAX_TOKENS:
        raise InvalidMessage(f"the message counts {tokens} tokens; the ledger holds at most "
                             f"{MAX_TOKENS} per message (check the token counter's ratio)",
                             field="tokens")
    return tokens


PRE_COMPACT_LABEL = "auto:pre-compact"
STRATEGIES = ("truncate", "priority", "importance", "summarize")
FallbackHook = Callable[[str, str, BaseException], Awaitable[None] | None]


@dataclass(frozen=True)
class ManageResult:
    """What ``manage()`` found and did."""

    state: str
    actions: tuple[str, ...]
    tokens_before: int
    tokens_after: int


@dataclass
class _OpenCalls:
    """Tool calls at the view's tail still waiting for their results."""

    call: ViewItem
    missing: list[str]
    after: ViewItem


class Session:
    """One conversation's memory. Obtain it from ``Ledger.session``.

    Satisfies the Amplifier ``ContextManager`` protocol; everything it writes is an
    event in the ledger, everything it reads is a projection of those events.
    """

    def __init__(self, ledger: Ledger, info: SessionInfo, config: ContextConfig,
                 counter: TokenCounter) -> None:
        self._ledger = ledger
        self._store = ledger.store
        self.session_id = info.session_id
        self._info = info
        self._config = config
        self._head = info.head
        self._view_tokens = info.view_tokens
        self.counter = counter
        self.hooks = HookBus(forward_to=ledger.hook_target)
        #: Asked before every compaction (manual or auto); may cancel it or supply a summary.
        self.pre_compact: PreCompactHandler | None = ledger.pre_compact
        #: Called as ``on_fallback(from_model, to_model, error)`` when a summarizer model fails.
        self.on_fallback: FallbackHook | None = None
        self._ephemeral: list[ViewItem] = []
        self._request_state: RequestState | None = None
        self._open: _OpenCalls | None = None
        self._tail_known = False
        self._compacting = False

    def __repr__(self) -> str:
        return f"<Session {self.session_id!r} head={self._head} store={self._store.kind}>"

    # -- state ------------------------------------------------------------------------

    @property
    def head(self) -> int:
        """The last seq this process wrote or read (``refresh`` re-reads it)."""
        return self._head

    @property
    def model(self) -> str | None:
        return self._info.model

    @property
    def config(self) -> ContextConfig:
        return self._config

    @property
    def metadata(self) -> Mapping[str, Any]:
        return self._info.metadata

    async def refresh(self) -> SessionInfo:
        self._info = await self._store.session_info(self.session_id)
        self._head, self._view_tokens = self._info.head, self._info.view_tokens
        self._tail_known = False
        return self._info

    async def get_token_count(self) -> int:
        """Tokens in the working view (persisted + ephemeral); O(1), never re-tokenizes."""
        return self._view_tokens + sum(i.tokens for i in self._ephemeral)

    def limits(self, model: str | None = None) -> ModelLimits:
        """Context window and output limit of ``model`` (default: the session's)."""
        cfg = self._config
        name = model or self.model
        if cfg.context_window and not model:
            return ModelLimits(cfg.context_window, cfg.max_output_tokens, "config")
        if not name:
            return ModelLimits(cfg.context_window or cfg.max_tokens or 8192,
                               cfg.max_output_tokens, "default")
        return model_limits(name, cfg.model_overrides or None)

    def budget(
        self, token_budget: int | None = None, provider: Any | None = None, *,
        model: str | None = None, max_tokens: int | None = None,
    ) -> Budget:
        """The request budget: explicit, else from the provider, else from the model's limits.

        ``max_tokens`` is the request's output allowance; ``config.max_tokens`` caps
        the context itself (as Amplifier's ``max_tokens`` does).
        """
        cfg = self._config
        if token_budget is not None:
            if isinstance(token_budget, bool) or not isinstance(token_budget, int) or (
                    token_budget <= 0):
                raise InvalidArgument("token_budget must be a positive int",
                                      field="token_budget")
            cap = min(token_budget, cfg.max_tokens) if cfg.max_tokens else token_budget
            return Budget(context_window=cap, output_reserve=0, safety_margin=0)
        if not (model or self.model or cfg.context_window) and provider is None and (
                cfg.max_tokens):
            # No model to take limits from: the configured cap is the budget.
            return Budget(context_window=cfg.max_tokens, output_reserve=0, safety_margin=0)
        limits = self.limits(model)
        found = budget_from_provider(
            provider, fallback_context_window=limits.context_window,
            fallback_max_output_tokens=limits.max_output_tokens, request_max_tokens=max_tokens,
            config_max_tokens_cap=cfg.max_output_tokens,
        ) if provider is not None else None
        result = found or budget_for(
            limits.context_window, limits.max_output_tokens, request_max_tokens=max_tokens,
            config_max_tokens_cap=cfg.max_output_tokens, margin=cfg.safety_margin)
        if cfg.max_tokens and cfg.max_tokens < result.available:
            return Budget(context_window=cfg.max_tokens, output_reserve=0, safety_margin=0)
        return result

    async def usage(self, model: str | None = None, max_tokens: int | None = None) -> Usage:
        """Tokens, budget, fraction and state (healthy/warning/critical/overflow); O(1)."""
        if model is not None:
            _check_text(model, "model")
        if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(
                max_tokens, int) or max_tokens <= 0):
            raise InvalidArgument("max_tokens must be a positive int", field="max_tokens")
        b = self.budget(model=model, max_tokens=max_tokens)
        return usage(await self.get_token_count(), b,
                     thresholds_for(model or self.model, self._config.profile))

    # -- writing ----------------------------------------------------------------------

    async def _append(
        self, payloads: Sequence[Payload], *, expected_seq: int | None = None,
        idempotency_key: str | None = None,
    ) -> int:
        self._ledger._check_open()
        result = await self._store.append(
            self.session_id, payloads, created_at=_now(), expected_seq=expected_seq,
            idempotency_key=idempotency_key)
        if not result.duplicate:
            self._head = result.seq
            self._view_tokens = result.view_tokens
            if not all(isinstance(p, MessageAppended | CheckpointCreated) for p in payloads):
                self._view_changed()
        return result.seq

    def _view_changed(self) -> None:
        """A cold-path event rewrote the view: re-derive what was cached from it."""
        self._request_state = None
        self._tail_known = False

    async def _ensure_tail(self) -> None:
        if self._tail_known:
            return
        self._open = None
        view = await self._store.read_view(self.session_id)
        if view:
            last = group_units(view)[-1]
            if last.missing and not last.orphan:
                self._open = _OpenCalls(view[last.start], list(last.missing),
                                        view[last.stop - 1])
        self._tail_known = True

    def _track(self, item: ViewItem) -> None:
        calls = tool_calls(item.message)
        if calls:
            self._open = _OpenCalls(item, [c[0] for c in calls], item)
            return
        answered = set(result_ids(item.message)) - {""}
        if self._open is not None and answered & set(self._open.missing):
            self._open.missing = [m for m in self._open.missing if m not in answered]
            self._open.after = item
            if not self._open.missing:
                self._open = None
            return
        self._open = None

    async def add_message(
        self, message: Mapping[str, Any], *, critical: bool = False, ephemeral: bool = False,
        idempotency_key: str | None = None, expected_seq: int | None = None,
    ) -> int | None:
        """Append ``message``; return its seq (``None`` for an ephemeral message).

        ``expected_seq`` is the head the caller believes current: if another writer
        got there first, ``ConcurrencyError`` and nothing is written. A retry with
        the same ``idempotency_key`` returns the original seq and writes nothing.
        A tool call left unanswered when the conversation moves on gets a synthetic
        error result, recorded once, right before this message.
        """
        self._ledger._check_open()
        copied = validate_message(message)
        key = _check_key(idempotency_key)
        expected = _check_seq(expected_seq, "expected_seq")
        if not isinstance(critical, bool) or not isinstance(ephemeral, bool):
            raise InvalidArgument("critical and ephemeral must be bools")
        tokens = _checked_tokens(self.counter.count_message(copied))
        seq: int | None
        if ephemeral:
            if key is not None or expected is not None:
                raise InvalidArgument("an ephemeral message takes no idempotency_key or "
                                      "expected_seq: it is never written")
            slot = self._head * ORD_STRIDE + ORD_STRIDE // 2 + len(self._ephemeral)
            self._ephemeral.append(ViewItem(ref=(-self._head, len(self._ephemeral)), ord=slot,
                                            message=copied, tokens=tokens, critical=critical,
                                            kind="ephemeral"))
            seq = None
        else:
            await self._ensure_tail()
            open_calls = self._open
            synthetic: list[Payload] = []
            if open_calls is not None and not (
                    set(result_ids(copied)) & set(open_calls.missing)):
                synthetic = [
                    MessageAppended(dict(syn.message), syn.tokens, False, self.counter.name,
                                    origin="synthetic")
                    for syn in synthetic_results(open_calls.call, open_calls.after,
                                                 open_calls.missing, self.counter)]
            payloads = [*synthetic, MessageAppended(copied, tokens, critical, self.counter.name)]
            # Synthetic results are decided from this process's view of the tail: pin the
            # batch to the head they were decided at, and decide again if someone wrote.
            pin = self._head if synthetic and expected is None else expected
            try:
                seq = await self._append(payloads, expected_seq=pin, idempotency_key=key)
            except ConcurrencyError:
                if expected is not None or not synthetic:
                    raise
                await self.refresh()
                return await self.add_message(message, critical=critical,
                                              idempotency_key=key)
            if synthetic:
                self._open = None
            self._track(ViewItem(ref=(seq, 0), ord=seq * ORD_STRIDE, message=copied,
                                 tokens=tokens, critical=critical))
        if self.hooks.has_listeners(hk.MESSAGE_ADDED):
            await self.hooks.emit(hk.MESSAGE_ADDED, {
                "role": copied["role"], "content_length": len(str(copied.get("content") or "")),
                "tokens": tokens, "seq": seq, "ephemeral": ephemeral,
                "total_tokens": await self.get_token_count()})
        if self._config.auto_compact and not self._compacting:
            current = await self.usage()
            if current.fraction >= self._config.compact_threshold:
                await self.manage(trigger="auto")
        return seq

    async def include(self, source: str, content: str, *, role: str = "system",
                      ephemeral: bool = False) -> int | None:
        """Inject context from ``source`` (a hook, a retriever) and say so on the bus."""
        if not isinstance(source, str) or not source:
            raise InvalidArgument("include needs a non-empty source name", field="source")
        seq = await self.add_message({"role": role, "content": content}, ephemeral=ephemeral)
        await self.hooks.emit(hk.INCLUDE, {"source": source, "content": content, "seq": seq})
        return seq

    async def set_messages(self, messages: Sequence[Mapping[str, Any]]) -> int:
        """Replace the branch and the view with ``messages`` (session restore)."""
        if isinstance(messages, str | bytes | Mapping) or not isinstance(messages, Sequence):
            raise InvalidArgument("set_messages takes a list of messages")
        copies = [validate_message(m) for m in messages]
        tokens = tuple(_checked_tokens(self.counter.count_message(m)) for m in copies)
        self._ephemeral.clear()
        return await self._append([MessagesReplaced(tuple(copies), tokens, self.counter.name)])

    async def clear(self) -> int:
        self._ephemeral.clear()
        return await self._append([SessionCleared()])

    async def checkpoint(self, label: str | None = None) -> Checkpoint:
        if label is not None:
            _check_text(label, "label")
        if isinstance(label, str) and label.isdigit():
            raise InvalidArgument("a checkpoint label cannot be all digits (it would read as "
                                  "a seq in rollback)")
        seq = await self._append([CheckpointCreated(label)])
        return Checkpoint(seq, label, _now())

    async def checkpoints(self) -> list[Checkpoint]:
        return await self._store.checkpoints(self.session_id)

    async def rollback(self, to: Checkpoint | str | int) -> int:
        """Make the view exactly what it was right after a checkpoint (or any seq).

        Events after it stay in the ledger; a rollback can itself be rolled back.
        """
        label: str | None = None
        checkpoint_seq: int | None = None
        if isinstance(to, Checkpoint):
            to_seq, checkpoint_seq, label = to.seq, to.seq, to.label
            if to.seq not in {c.seq for c in await self.checkpoints()}:
                raise CheckpointNotFound(f"seq {to.seq} is not a checkpoint of "
                                         f"session {self.session_id!r}")
        elif isinstance(to, bool):
            raise InvalidArgument("rollback takes a Checkpoint, a label or a seq")
        elif isinstance(to, int):
            to_seq = _check_seq(to, "to") or 0
        elif isinstance(to, str):
            _check_text(to, "label")
            matches = [c for c in await self.checkpoints() if c.label == to]
            if not matches:
                raise CheckpointNotFound(f"no checkpoint labelled {to!r} in session "
                                         f"{self.session_id!r}", label=to)
            to_seq, checkpoint_seq, label = matches[-1].seq, matches[-1].seq, to
        else:
            raise InvalidArgument("rollback takes a Checkpoint, a label or a seq")
        self._ephemeral.clear()
        seq = await self._append([RolledBack(to_seq, checkpoint_seq, label)])
        await self.refresh()  # the model and settings in force at the target come back too
        self._config = self._ledger._config_from(self._info.config)
        self.counter = self._ledger.counter_for(self._info.model, self._config)
        return seq

    async def record_summary(
        self, from_seq: int, to_seq: int, summary: str | Mapping[str, Any], *,
        audit: Mapping[str, Any] | None = None, role: str = "user",
    ) -> int:
        """Low-level: one summary item replaces the view items positioned in the range."""
        for name, v in (("from_seq", from_seq), ("to_seq", to_seq)):
            if not _check_seq(v, name):
                raise InvalidArgument(f"{name} must be a positive int", field=name)
        if isinstance(summary, str):
            if not summary.strip():
                raise InvalidArgument("a summary cannot be empty")
            message: dict[str, Any] = validate_message({"role": role, "content": summary})
        else:
            message = validate_message(summary)
        payload = SummaryRecorded(from_seq, to_seq, message,
                                  _checked_tokens(self.counter.count_message(message)),
                                  _check_mapping(audit, "audit"))
        return await self._append([payload])

    async def update_config(self, config: Mapping[str, Any] | ContextConfig) -> int:
        """Record new settings; replay then knows which were in force at every seq."""
        new = config if isinstance(config, ContextConfig) else self._config.merged(config)
        return await self._change(new, None)

    async def set_model(self, model: str) -> int:
        """Switch model: the current view is recounted once with the new counter (an event)."""
        return await self._change(None, _check_text(model, "model"))

    async def _change(self, config: ContextConfig | None, model: str | None) -> int:
        """Record a settings and/or model change as one batch: both land, or neither."""
        payloads: list[Payload] = []
        new_config = config or self._config
        new_model = model or self.model
        counter = self._ledger.counter_for(new_model, new_config)
        if config is not None:
            self._ledger._remember_secrets(config)
            payloads.append(ConfigChanged(config.to_dict()))
        if model is not None or counter.name != self.counter.name:  # recount once
            items = await self._store.read_view(self.session_id)
            recount = tuple((i.ref, _checked_tokens(counter.count_message(i.message)))
                            for i in items)
            payloads.append(ModelChanged(new_model, counter.name, recount))
        if not payloads:
            return self._head
        seq = await self._append(payloads)
        self._config, self.counter = new_config, counter
        await self.refresh()
        return seq

    # -- compaction -------------------------------------------------------------------

    def _target(self, budget: int) -> tuple[int, int]:
        """(trigger, target) token levels for ``budget``."""
        cfg = self._config
        cap = min(budget, cfg.max_tokens) if cfg.max_tokens else budget
        return math.floor(cfg.compact_threshold * cap), max(1, math.floor(cfg.compact_target * cap))

    async def compact(self, strategy: str | None = None, *,
                      trigger: Literal["manual", "auto"] = "manual",
                      token_budget: int | None = None) -> int:
        """Persist a compaction decision; return the tokens it saved (0: nothing to do).

        A checkpoint (``auto:pre-compact``) is written first, in the same transaction,
        so ``rollback`` to it undoes the compaction; ``view_at`` and ``rebuild`` replay it.
        """
        name = strategy or self._config.compaction_strategy
        if name not in STRATEGIES:
            raise InvalidArgument(f"unknown strategy {name!r}; one of {STRATEGIES}",
                                  field="strategy")
        if trigger not in ("manual", "auto"):
            raise InvalidArgument("trigger is 'manual' or 'auto'", field="trigger")
        budget = self.budget(token_budget).available
        _, target = self._target(budget)
        items = await self._store.read_view(self.session_id)
        before = sum(i.tokens for i in items)
        decision = await hk.decide(self.pre_compact, CompactContext(
            trigger, before, target, len(items), None))
        if decision.cancel:
            log.info("compaction_cancelled", session_id=self.session_id, trigger=trigger)
            return 0
        await self.hooks.emit(hk.PRE_COMPACT, {
            "message_count": len(items), "tokens": before, "strategy": name,
            "trigger": trigger, "target_tokens": target})
        self._compacting = True
        try:
            saved, used = 0, name
            if decision.custom_summary is not None or name == "summarize":
                try:
                    saved = await self._summarize(items, budget, decision, trigger)
                except CompactionError as exc:
                    if exc.code == "NO_TOKEN_BUDGET":
                        raise
                    if exc.code == "MIN_MESSAGES_NOT_MET":  # too little to fold: nothing happens
                        log.info("summarize_skipped", session_id=self.session_id,
                                 reason=str(exc))
                    else:  # no model gave a valid summary: the deterministic strategy
                        log.warning("summarize_fell_back", session_id=self.session_id,
                                    code=exc.code, error=str(exc))
                        used = "truncate"
                        saved = await self._compact_plan(items, "truncate", target, budget,
                                                         failure=exc)
            else:
                saved = await self._compact_plan(items, name, target, budget)
        finally:
            self._compacting = False
        after = await self.get_token_count()
        await self.hooks.emit(hk.POST_COMPACT, {
            "message_count": len(await self._store.read_view(self.session_id)),
            "tokens": after, "tokens_before": before, "tokens_after": after,
            "tokens_saved": saved, "strategy": used, "trigger": trigger})
        return saved

    async def _compact_plan(self, items: Sequence[ViewItem], strategy: str, target: int,
                            budget: int, *, failure: CompactionError | None = None) -> int:
        p = plan(items, target_tokens=target, budget_tokens=budget, config=self._config,
                 counter=self.counter, strategy=strategy)
        return await self._record_plan(items, p.drop, p.prune, strategy, failure)

    async def _record_plan(self, items: Sequence[ViewItem], drop: Sequence[Any],
                           prune: Mapping[Any, Mapping[str, Any]], strategy: str,
                           failure: CompactionError | None = None) -> int:
        present = {i.ref: i for i in items}
        drop = tuple(r for r in drop if r in present)
        pruned = tuple(Pruned(r, dict(m), self.counter.count_message(m))
                       for r, m in prune.items() if r in present and r not in drop)
        if not drop and not pruned:
            return 0
        before = sum(i.tokens for i in items)
        after = before - sum(present[r].tokens for r in drop) - sum(
            present[p.ref].tokens - p.tokens for p in pruned)
        payload = CompactionApplied(strategy, drop, pruned, before, after)
        await self._append([CheckpointCreated(PRE_COMPACT_LABEL), payload])
        if failure is not None:
            log.info("compaction_after_summary_failure", session_id=self.session_id,
                     code=failure.code)
        return before - after

    def _model_specs(self) -> list[Any]:
        from .summarizer import ModelSpec

        specs = []
        for m in self._config.summarizer.models:
            key = m.api_key
            if key in (None, REDACTED):
                key = self._ledger._secrets.get((m.model, m.api_base))
            specs.append(ModelSpec(m.model, api_base=m.api_base, api_key=key,
                                   timeout=m.timeout, num_retries=m.num_retries))
        return specs

    async def _summarize(self, items: Sequence[ViewItem], budget: int,
                         decision: CompactDecision, trigger: str) -> int:
        """Fold older turns into one rolling summary event; nothing is written on failure."""
        from .summarizer import SummaryRequest, summarize, validate_summary

        scfg = self._config.summarizer
        refs = select_for_summary(items, preserve_recent_turns=scfg.preserve_recent_turns,
                                  preserve_tokens=scfg.preserve_tokens,
                                  min_messages=scfg.min_messages)
        if refs is None:
            raise CompactionError(
                f"fewer than {scfg.min_messages} messages before the preserved tail",
                code="MIN_MESSAGES_NOT_MET")
        chosen = set(refs)
        covered = [i for i in items if i.ref in chosen]
        priors = [i for i in covered if i.kind == "summary"]
        prior_text = str(priors[-1].message.get("content")) if priors else None
        before = sum(i.tokens for i in covered)
        await self.hooks.emit(hk.OVERFLOW, {
            "estimated_tokens": sum(i.tokens for i in items), "context_limit": budget})
        attempts: list[dict[str, Any]] = []
        if decision.custom_summary is not None:
            text, _ = validate_summary(decision.custom_summary, counter=self.counter,
                                       tokens_before=before, model="pre_compact hook")
            model, prompt_version = "pre_compact hook", None
        else:
            result = await summarize(
                SummaryRequest([dict(i.message) for i in covered if i.kind != "summary"],
                               prior_text, decision.custom_instructions,
                               scfg.max_summary_tokens, scfg.prompt),
                self._model_specs(), counter=self.counter, tokens_before=before,
                on_fallback=self.on_fallback, offline_fallback=scfg.offline_fallback)
            text, model, prompt_version = result.text, result.model, result.prompt_version
            attempts = [{"model": a.model, "ok": a.ok, "error_type": a.error_type,
                         "error": a.error, "elapsed_s": round(a.elapsed_s, 3)}
                        for a in result.attempts]
        message = {"role": scfg.summary_role, "content": text}
        tokens = self.counter.count_message(message)
        audit = {
            "covered": [covered[0].position, covered[-1].position],
            "prior_summary_seq": priors[-1].seq if priors else None, "model": model,
            "attempts": attempts, "tokens_before": before, "tokens_after": tokens,
            "prompt_version": prompt_version,
            "custom_instructions": decision.custom_instructions, "trigger": trigger,
            "counter": self.counter.name,
        }
        first, last = covered[0].place, covered[-1].place
        payload = SummaryRecorded(first[0], last[0], message, tokens, audit,
                                  from_part=first[1], to_part=last[1])
        await self._append([CheckpointCreated(PRE_COMPACT_LABEL), payload])
        await self.hooks.emit(hk.SUMMARIZATION, {
            "summary_length": len(text), "preserved_messages": len(items) - len(covered),
            "model": model, "tokens_before": before, "tokens_after": tokens})
        return before - tokens

    async def manage(self, *, trigger: Literal["manual", "auto"] = "manual") -> ManageResult:
        """Measure the state and apply what it calls for (Vellum's ``manage``).

        warning → prune tool outputs; critical → compact with the configured
        strategy; overflow → the most aggressive safe strategy (truncate).
        """
        current = await self.usage()
        before = current.tokens
        actions: list[str] = []
        state = str(current.state)
        if state == "warning":
            items = await self._store.read_view(self.session_id)
            pruned = prune_tool_outputs(items, config=self._config, counter=self.counter)
            saved = await self._record_plan(items, (), pruned, "prune") if pruned else 0
            if saved:
                actions.append(f"pruned {len(pruned)} tool outputs ({saved} tokens)")
        elif state == "critical":
            saved = await self.compact(trigger=trigger)
            if saved:
                actions.append(f"compacted with {self._config.compaction_strategy} "
                               f"({saved} tokens)")
        elif state == "overflow":
            await self.hooks.emit(hk.OVERFLOW, {"estimated_tokens": before,
                                                "context_limit": current.budget})
            saved = await self.compact("truncate", trigger=trigger)
            if saved:
                actions.append(f"emergency truncate ({saved} tokens)")
        return ManageResult(state, tuple(actions), before, await self.get_token_count())

    # -- reading ----------------------------------------------------------------------

    async def view_items(self) -> tuple[ViewItem, ...]:
        """The working view as items (refs, tokens, kinds), ephemeral ones merged in."""
        self._ledger._check_open()
        items = await self._store.read_view(self.session_id)
        if not self._ephemeral:
            return items
        return tuple(sorted((*items, *self._ephemeral), key=lambda i: i.ord))

    async def view(self) -> list[dict[str, Any]]:
        """The working view: summaries and persisted compactions applied."""
        return [dict(i.message) for i in await self.view_items()]

    async def get_messages(self) -> list[dict[str, Any]]:
        """The current branch's messages in order: no compaction, no summaries."""
        self._ledger._check_open()
        branch = await self._store.read_branch(self.session_id)
        if not self._ephemeral:
            return branch
        return branch + [dict(i.message) for i in self._ephemeral]

    def _target_model(self, provider: Any | None) -> str | None:
        for attr in ("default_model", "model"):
            value = getattr(provider, attr, None)
            if isinstance(value, str) and value:
                return value
        name = getattr(provider, "name", None)
        return name if isinstance(name, str) and name else self.model

    async def get_messages_for_request(
        self, token_budget: int | None = None, provider: Any | None = None
    ) -> list[dict[str, Any]]:
        """Messages for the next request: within budget, valid for the provider.

        Compaction here is ephemeral (nothing is written) and hysteretic: it triggers
        at ``compact_threshold`` and goes down to ``compact_target``, and later
        requests reuse that decision, so the prompt prefix stays stable. With
        ``auto_compact`` and the ``summarize`` strategy, a rolling summary is recorded
        once when the view crosses the threshold and serves the following requests.
        """
        budget = self.budget(token_budget, provider).available
        cfg = self._config
        if cfg.auto_compact and cfg.compaction_strategy == "summarize" and not self._compacting:
            # Summarize at the level the planner below compacts at once a summary (and
            # the bridges it reserves room for) exists; otherwise the turns in between
            # would get an ephemeral pass: a changed prefix, and request_at != sent.
            await self._auto_summarize(budget - bridge_cost(self.counter))
        items = await self.view_items()
        previous = self._request_state
        budget -= bridge_reserve(items, self.counter)  # finish may add bridge messages
        try:
            if budget <= 0:
                raise CompactionError("no room left once bridge messages are reserved",
                                      code="NO_TOKEN_BUDGET")
            view, state = plan_request(items, budget_tokens=budget, config=cfg,
                                       counter=self.counter, previous=previous)
        except CompactionError as exc:
            await self.hooks.emit(hk.OVERFLOW, {
                "estimated_tokens": sum(i.tokens for i in items), "context_limit": budget})
            raise exc
        self._request_state = state
        if state.passes != (previous.passes if previous is not None else 0):
            tokens = sum(i.tokens for i in items)
            await self.hooks.emit(hk.PRE_COMPACT, {
                "message_count": len(items), "tokens": tokens, "ephemeral": True})
            await self.hooks.emit(hk.POST_COMPACT, {
                "message_count": len(view), "tokens": state.tokens_after,
                "tokens_before": tokens, "tokens_after": state.tokens_after,
                "tokens_saved": tokens - state.tokens_after,
                "strategy": cfg.compaction_strategy, "ephemeral": True})
        return finish_request_view(view, target_model=self._target_model(provider))

    async def _auto_summarize(self, budget: int) -> None:
        """Record a rolling summary once the view crosses the threshold.

        ``compact`` never loses the turn: if no model gives a valid summary it records
        the deterministic strategy instead, which takes the view down to the target,
        so the next attempt waits for the next crossing (no retry storm).
        """
        trigger, _ = self._target(budget)
        if await self.get_token_count() >= trigger:
            await self.compact("summarize", trigger="auto", token_budget=budget)

    def events(self, from_seq: int = 1, to_seq: int | None = None) -> AsyncIterator[Event]:
        """The session's events in seq order (an async iterator; pages under the hood)."""
        self._ledger._check_open()
        _check_seq(from_seq, "from_seq")
        _check_seq(to_seq, "to_seq")
        return self._store.read_events(self.session_id, from_seq, to_seq)

    async def _fold_to(self, seq: int) -> Any:
        if isinstance(seq, bool) or not isinstance(seq, int) or not 1 <= seq <= self._head:
            await self.refresh()
            if isinstance(seq, bool) or not isinstance(seq, int) or not 1 <= seq <= self._head:
                raise InvalidArgument(f"seq must be an int in 1..{self._head}")
        return fold([e async for e in self._store.read_events(self.session_id, 1, seq)])

    async def view_at(self, seq: int) -> list[dict[str, Any]]:
        """The working view right after ``seq`` (replayed from the events)."""
        return [dict(i.message) for i in (await self._fold_to(seq)).view]

    async def request_at(self, seq: int, provider: Any | None = None) -> list[dict[str, Any]]:
        """What a request built right after ``seq`` carried, when no ephemeral
        compaction was needed: the replayed view, finished for the provider."""
        return finish_request_view((await self._fold_to(seq)).view,
                                   target_model=self._target_model(provider))

    async def verify(self) -> VerifyReport:
        return await self._store.verify(self.session_id)


class Ledger:
    """A handle on one store. ``async with Ledger.open(dsn) as ledger: ...``"""

    def __init__(self, store: Store, *, config: ContextConfig | Mapping[str, Any] | None = None,
                 dsn: str | None = None) -> None:
        self.store = store
        self.dsn = dsn
        self.config = config if isinstance(config, ContextConfig) else (
            ContextConfig.from_mapping(config))
        #: Where session hook events are forwarded too (an Amplifier coordinator's hooks).
        self.hook_target: Any | None = None
        #: Default pre-compact handler for sessions opened from here.
        self.pre_compact: PreCompactHandler | None = None
        self._secrets: dict[tuple[str, str | None], str] = {}
        self._counters: dict[tuple[str, str | None], TokenCounter] = {}
        self._remember_secrets(self.config)
        self._closed = False

    def __repr__(self) -> str:
        where = redact(self.dsn) if self.dsn else self.store.kind
        return f"<Ledger {where}>"

    @classmethod
    def open(
        cls, dsn: str | None = None, *, home: str | None = None, migrate: bool | None = None,
        config: ContextConfig | Mapping[str, Any] | str | None = None, pool_size: int = 10,
    ) -> _Opener:
        """Open a ledger: ``None`` → embedded PostgreSQL, ``postgresql://…``, or ``memory://``.

        The embedded server is migrated on first use; another server must already be
        migrated unless ``migrate=True`` (otherwise ``MigrationRequired`` says how).
        ``config`` (dict, YAML text or ``ContextConfig``) is the default for sessions.
        """
        return _Opener(cls, dsn, home, migrate, config, pool_size)

    @classmethod
    async def _open(
        cls, dsn: str | None, home: str | None, migrate: bool | None,
        config: ContextConfig | Mapping[str, Any] | str | None, pool_size: int,
    ) -> Ledger:
        from pathlib import Path

        cfg = config if isinstance(config, ContextConfig) else ContextConfig.from_mapping(config)
        if dsn == "memory://":
            return cls(MemoryStore(), config=cfg, dsn=dsn)
        from .ledger import migrate as migrations
        from .ledger.postgres import PostgresStore

        if dsn is None:
            from .ledger import embedded

            dsn = await asyncio.to_thread(embedded.start, Path(home) if home else None)
            migrate = True if migrate is None else migrate
        elif not isinstance(dsn, str) or not is_postgres(dsn):
            raise InvalidArgument(
                "dsn must be None (embedded), 'memory://' or a postgresql:// URL", field="dsn")
        if migrate:
            await migrations.upgrade(dsn)
        store = await PostgresStore.connect(dsn, max_size=pool_size)
        try:
            await store.require_revision(migrations.head_revision())
        except BaseException:
            await store.close()
            raise
        return cls(store, config=cfg, dsn=dsn)

    def _check_open(self) -> None:
        if self._closed:
            raise LedgerClosed("this ledger is closed")

    def _remember_secrets(self, config: ContextConfig) -> None:
        """API keys stay in this process: the ledger records configs redacted."""
        for m in config.summarizer.models:
            if m.api_key and m.api_key != REDACTED:
                self._secrets[(m.model, m.api_base)] = m.api_key

    def _config_from(self, stored: Mapping[str, Any]) -> ContextConfig:
        return ContextConfig.from_mapping(stored) if stored else self.config

    def counter_for(self, model: str | None, config: ContextConfig) -> TokenCounter:
        key = (config.token_counter, model)
        counter = self._counters.get(key)
        if counter is None:
            counter = self._counters[key] = get_counter(config.token_counter, model)
        return counter

    async def session(
        self, session_id: str, *, create: bool = True, model: str | None = None,
        config: ContextConfig | Mapping[str, Any] | str | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> Session:
        """Open (or create) a session. A different ``config`` or ``model`` is recorded."""
        self._check_open()
        _check_session_id(session_id)
        if model is not None:
            _check_text(model, "model")
        meta = _check_mapping(metadata, "metadata")
        passed: ContextConfig | None = None
        if isinstance(config, ContextConfig):
            passed = config
        elif config is not None:
            passed = self.config.merged(config)
        if passed is not None:
            self._remember_secrets(passed)
        try:
            info = await self.store.session_info(session_id)
        except SessionNotFound:
            if not create:
                raise
            effective = passed or self.config
            try:
                info = await self.store.create_session(
                    session_id, SessionCreated(model, effective.to_dict(), meta),
                    created_at=_now())
            except SessionExists:  # created concurrently: open it instead
                info = await self.store.session_info(session_id)
        stored = self._config_from(info.config)
        session = Session(self, info, stored, self.counter_for(info.model, stored))
        if config is not None and not isinstance(config, ContextConfig):
            wanted = stored.merged(config)
        else:
            wanted = passed or stored
        changed = wanted.to_dict() != stored.to_dict()
        new_model = model if model is not None and model != info.model else None
        if changed or new_model:
            await session._change(wanted if changed else None, new_model)
        if not changed:
            session._config = wanted  # same settings, possibly with this process's secrets
        return session

    async def sessions(self) -> list[SessionInfo]:
        self._check_open()
        return await self.store.list_sessions()

    async def verify(self, session_id: str) -> VerifyReport:
        self._check_open()
        return await self.store.verify(_check_session_id(session_id))

    async def verify_all(self) -> list[VerifyReport]:
        return [await self.store.verify(s.session_id) for s in await self.sessions()]

    async def rebuild(self, session_id: str | None = None) -> list[RebuildReport]:
        """Recompute view rows from the events; report (and repair) any difference."""
        self._check_open()
        ids = [_check_session_id(session_id)] if session_id is not None else [
            s.session_id for s in await self.store.list_sessions()]
        return [await self.store.rebuild(i) for i in ids]

    async def close(self) -> None:
        if not self._closed:
            self._closed = True
            await self.store.close()


class _Opener:
    """``Ledger.open(...)`` works both as ``await`` and as ``async with``."""

    def __init__(self, cls: type[Ledger], *args: Any) -> None:
        self._cls, self._args = cls, args
        self._ledger: Ledger | None = None

    def __await__(self) -> Generator[Any, None, Ledger]:
        return self._cls._open(*self._args).__await__()

    async def __aenter__(self) -> Ledger:
        self._ledger = await self._cls._open(*self._args)
        return self._ledger

    async def __aexit__(self, *exc: object) -> None:
        if self._ledger is not None:
            await self._ledger.close()
