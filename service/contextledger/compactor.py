"""Compaction for one session: compact, manage, summaries, and when it runs by itself.

Automatic compaction is decided in two places: ``maybe_compact`` after an append
(``auto_compact``), ``summarize_in_background`` after a request (the ``summarize``
strategy, off the turn's path). What to drop or summarize is decided by
the pure planners in ``core/compaction``; this module records the decision as events
(a checkpoint first, so a rollback undoes it) and announces it on the hook bus.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import structlog

from contextledger import hooks as hk
from contextledger import telemetry
from contextledger.core.budget import Budget, Usage
from contextledger.core.compaction import RequestPlanner, plan, prune_tool_outputs
from contextledger.core.compaction.request import thresholds
from contextledger.core.compaction.select import select_for_summary
from contextledger.core.config import REDACTED, STRATEGIES, ContextConfig
from contextledger.core.events import (
    CheckpointCreated,
    CompactionApplied,
    Payload,
    Pruned,
    SummaryRecorded,
)
from contextledger.core.projection import NOT_IN_VIEW
from contextledger.core.summary.prompt import SummaryRequest
from contextledger.core.summary.validate import validate_summary
from contextledger.core.tokens import TokenCounter
from contextledger.core.view import ViewItem
from contextledger.errors import CompactionError, ConcurrencyError, InvalidArgument
from contextledger.hooks import CompactContext, CompactDecision, HookBus, PreCompactHandler
from contextledger.session_state import SessionState
from contextledger.summarizer import FallbackCallback, ModelSpec, summarize

log = structlog.get_logger(__name__)

PRE_COMPACT_LABEL = "auto:pre-compact"


class CompactedSession(Protocol):
    """What the compactor needs of the ``Session`` it works for (a port: no import cycle)."""

    session_id: str
    counter: TokenCounter
    hooks: HookBus
    pre_compact: PreCompactHandler | None
    on_fallback: FallbackCallback | None

    @property
    def config(self) -> ContextConfig: ...
    @property
    def head(self) -> int: ...
    def budget(self, token_budget: int | None = None) -> Budget: ...
    async def usage(self) -> Usage: ...
    async def get_token_count(self) -> int: ...


class Appender(Protocol):
    """The write path a compaction records its events through."""

    async def append(self, payloads: Sequence[Payload]) -> tuple[int, ...]: ...


@dataclass(frozen=True)
class ManageResult:
    """What ``manage()`` found and did."""

    state: str
    actions: tuple[str, ...]
    tokens_before: int
    tokens_after: int


class Compactor:
    """Compaction decisions for one ``Session``, recorded through that session."""

    def __init__(self, session: CompactedSession, state: SessionState, writes: Appender) -> None:
        self._s = session
        self._state = state
        self._writes = writes
        self._compacting = False
        self._summary_task: asyncio.Task[None] | None = None
        #: the last background summary that failed (typed), ``None`` once one succeeds
        self.summary_failure: CompactionError | None = None

    async def maybe_compact(self) -> None:
        """After an append, with ``auto_compact``: ``manage()`` once the view crosses the
        threshold of the budget in force. (``summarize`` makes its summaries in the
        background from the request path instead.)"""
        cfg = self._s.config
        if not cfg.auto_compact or self._compacting or cfg.compaction_strategy == "summarize":
            return
        current = await self._s.usage()  # against the budget in force
        if current.fraction >= cfg.compact_threshold:
            try:
                await self.manage(trigger="auto")
            except ConcurrencyError as exc:  # another writer compacted the view meanwhile:
                # the append stands, and the next one measures the view as it is now
                log.info("auto_compaction_raced", session_id=self._s.session_id, error=str(exc))

    async def compact(
        self,
        strategy: str | None = None,
        *,
        trigger: Literal["manual", "auto"] = "manual",
        token_budget: int | None = None,
    ) -> int:
        """``Session.compact``: checkpoint + compaction event; the tokens saved."""
        name = strategy or self._state.config.compaction_strategy
        if name not in STRATEGIES:
            raise InvalidArgument(
                f"unknown strategy {name!r}; one of {STRATEGIES}", field="strategy"
            )
        if trigger not in ("manual", "auto"):
            raise InvalidArgument("trigger is 'manual' or 'auto'", field="trigger")
        with telemetry.span(
            f"compact_events {name}",
            {
                "gen_ai.operation.name": "compact_events",
                "gen_ai.conversation.id": self._s.session_id,
                "gen_ai.compaction.trigger": trigger,
                "gen_ai.compaction.strategy": name,
                "contextledger.seq": self._s.head,
            },
        ) as span:
            saved = await self._compact(name, trigger, token_budget, span)
            if span is not None:
                span.set_attribute("contextledger.seq", self._s.head)
                span.set_attribute("gen_ai.compaction.tokens_saved", saved)
            return saved

    async def _compact(
        self,
        name: str,
        trigger: Literal["manual", "auto"],
        token_budget: int | None,
        span: Any | None,
    ) -> int:
        budget = self._s.budget(token_budget).available
        _, _, target = thresholds(max(1, budget), self._state.config)
        items = await self._state.store.read_view(self._s.session_id)
        before = sum(i.tokens for i in items)
        decision = await hk.decide(
            self._s.pre_compact, CompactContext(trigger, before, target, len(items), None)
        )
        if span is not None:
            span.set_attribute("gen_ai.compaction.tokens_before", before)
            span.set_attribute("gen_ai.compaction.event_count", len(items))
        if decision.cancel:
            log.info("compaction_cancelled", session_id=self._s.session_id, trigger=trigger)
            if span is not None:
                span.set_attribute("gen_ai.compaction.outcome", "cancelled")
            return 0
        await self._s.hooks.emit(
            hk.PRE_COMPACT,
            {
                "message_count": len(items),
                "tokens": before,
                "strategy": name,
                "trigger": trigger,
                "target_tokens": target,
            },
        )
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
                        log.info(
                            "summarize_skipped", session_id=self._s.session_id, reason=str(exc)
                        )
                    else:  # no model gave a valid summary: the deterministic strategy
                        log.warning(
                            "summarize_fell_back",
                            session_id=self._s.session_id,
                            code=exc.code,
                            error=str(exc),
                        )
                        used = "truncate"
                        saved = await self._compact_plan(
                            items, "truncate", target, budget, failure=exc
                        )
            else:
                saved = await self._compact_plan(items, name, target, budget)
        finally:
            self._compacting = False
        after = await self._s.get_token_count()
        if span is not None:
            span.set_attribute("gen_ai.compaction.tokens_after", after)
            span.set_attribute("gen_ai.compaction.strategy", used)
            span.set_attribute("gen_ai.compaction.outcome", "applied" if saved else "nothing")
        await self._s.hooks.emit(
            hk.POST_COMPACT,
            {
                "message_count": len(await self._state.store.read_view(self._s.session_id)),
                "tokens": after,
                "tokens_before": before,
                "tokens_after": after,
                "tokens_saved": saved,
                "strategy": used,
                "trigger": trigger,
            },
        )
        return saved

    async def _compact_plan(
        self,
        items: Sequence[ViewItem],
        strategy: str,
        target: int,
        budget: int,
        *,
        failure: CompactionError | None = None,
    ) -> int:
        p = plan(
            items,
            target_tokens=target,
            budget_tokens=budget,
            config=self._state.config,
            counter=self._s.counter,
            strategy=strategy,
        )
        return await self._record_plan(items, p.drop, p.prune, strategy, failure)

    async def _record(self, payload: Payload) -> None:
        """A compaction or summary with its checkpoint. Its items were read from the view
        by this process: refused as no longer there, another writer compacted or rolled
        back meanwhile, a conflict to retry on the view as it is now (nothing written)."""
        try:
            await self._writes.append([CheckpointCreated(PRE_COMPACT_LABEL), payload])
        except InvalidArgument as exc:
            if exc.code != NOT_IN_VIEW:
                raise
            raise ConcurrencyError(
                f"the view changed while this compaction was planned ({exc.args[0]}); "
                "nothing was written: compact again",
                head=self._s.head,
            ) from None

    async def _record_plan(
        self,
        items: Sequence[ViewItem],
        drop: Sequence[Any],
        prune: Mapping[Any, Mapping[str, Any]],
        strategy: str,
        failure: CompactionError | None = None,
    ) -> int:
        present = {i.ref: i for i in items}
        drop = tuple(r for r in drop if r in present)
        pruned = tuple(
            Pruned(r, dict(m), self._s.counter.count_message(m))
            for r, m in prune.items()
            if r in present and r not in drop
        )
        if not drop and not pruned:
            return 0
        before = sum(i.tokens for i in items)
        after = (
            before
            - sum(present[r].tokens for r in drop)
            - sum(present[p.ref].tokens - p.tokens for p in pruned)
        )
        payload = CompactionApplied(strategy, drop, pruned, before, after)
        await self._record(payload)
        if failure is not None:
            log.info(
                "compaction_after_summary_failure", session_id=self._s.session_id, code=failure.code
            )
        return before - after

    def _model_specs(self) -> list[Any]:
        specs = []
        for m in self._state.config.summarizer.models:
            key = m.api_key
            if key in (None, REDACTED):
                key = self._state.ledger.secret(m.model, m.api_base)
            specs.append(
                ModelSpec(
                    m.model,
                    api_base=m.api_base,
                    api_key=key,
                    timeout=m.timeout,
                    num_retries=m.num_retries,
                )
            )
        return specs

    async def _summarize(
        self, items: Sequence[ViewItem], budget: int, decision: CompactDecision, trigger: str
    ) -> int:
        """Fold older turns into one rolling summary event; nothing is written on failure."""
        scfg = self._state.config.summarizer
        refs = select_for_summary(
            items,
            preserve_recent_turns=scfg.preserve_recent_turns,
            preserve_tokens=scfg.preserve_tokens,
            min_messages=scfg.min_messages,
        )
        if refs is None:
            raise CompactionError(
                f"fewer than {scfg.min_messages} messages before the preserved tail",
                code="MIN_MESSAGES_NOT_MET",
            )
        chosen = set(refs)
        covered = [i for i in items if i.ref in chosen]
        priors = [i for i in covered if i.kind == "summary"]
        prior_text = str(priors[-1].message.get("content")) if priors else None
        before = sum(i.tokens for i in covered)
        await self._s.hooks.emit(
            hk.OVERFLOW, {"estimated_tokens": sum(i.tokens for i in items), "context_limit": budget}
        )
        attempts: list[dict[str, Any]] = []
        if decision.custom_summary is not None:
            text, _ = validate_summary(
                decision.custom_summary,
                counter=self._s.counter,
                tokens_before=before,
                model="pre_compact hook",
            )
            model, prompt_version = "pre_compact hook", None
        else:
            result = await summarize(
                SummaryRequest(
                    [dict(i.message) for i in covered if i.kind != "summary"],
                    prior_text,
                    decision.custom_instructions,
                    scfg.max_summary_tokens,
                    scfg.prompt,
                ),
                self._model_specs(),
                counter=self._s.counter,
                tokens_before=before,
                on_fallback=self._s.on_fallback,
                offline_fallback=scfg.offline_fallback,
            )
            text, model, prompt_version = result.text, result.model, result.prompt_version
            attempts = [
                {
                    "model": a.model,
                    "ok": a.ok,
                    "error_type": a.error_type,
                    "error": a.error,
                    "elapsed_s": round(a.elapsed_s, 3),
                }
                for a in result.attempts
            ]
        message = {"role": scfg.summary_role, "content": text}
        tokens = self._s.counter.count_message(message)
        audit = {
            "covered": [covered[0].position, covered[-1].position],
            "prior_summary_seq": priors[-1].seq if priors else None,
            "model": model,
            "attempts": attempts,
            "tokens_before": before,
            "tokens_after": tokens,
            "prompt_version": prompt_version,
            "custom_instructions": decision.custom_instructions,
            "trigger": trigger,
            "counter": self._s.counter.name,
        }
        first, last = covered[0].place, covered[-1].place
        payload = SummaryRecorded(
            first[0], last[0], message, tokens, audit, from_part=first[1], to_part=last[1]
        )
        await self._record(payload)
        await self._s.hooks.emit(
            hk.SUMMARIZATION,
            {
                "summary_length": len(text),
                "preserved_messages": len(items) - len(covered),
                "model": model,
                "tokens_before": before,
                "tokens_after": tokens,
            },
        )
        return before - tokens

    async def manage(self, *, trigger: Literal["manual", "auto"] = "manual") -> ManageResult:
        """Measure the state and apply what it calls for (Vellum's ``manage``).

        warning → prune tool outputs; critical → compact with the configured
        strategy; overflow → the most aggressive safe strategy (truncate).
        """
        current = await self._s.usage()
        before = current.tokens
        actions: list[str] = []
        state = str(current.state)
        if state == "warning":
            items = await self._state.store.read_view(self._s.session_id)
            pruned = prune_tool_outputs(items, config=self._state.config, counter=self._s.counter)
            saved = await self._record_plan(items, (), pruned, "prune") if pruned else 0
            if saved:
                actions.append(f"pruned {len(pruned)} tool outputs ({saved} tokens)")
        elif state == "critical":
            saved = await self.compact(trigger=trigger)
            if saved:
                actions.append(
                    f"compacted with {self._state.config.compaction_strategy} ({saved} tokens)"
                )
        elif state == "overflow":
            await self._s.hooks.emit(
                hk.OVERFLOW, {"estimated_tokens": before, "context_limit": current.budget}
            )
            saved = await self.compact("truncate", trigger=trigger)
            if saved:
                actions.append(f"emergency truncate ({saved} tokens)")
        return ManageResult(state, tuple(actions), before, await self._s.get_token_count())

    # -- background summaries (the summarize strategy, off the turn's path) ----------

    def summarize_in_background(self, planner: RequestPlanner) -> None:
        """With ``summarize``, fold what the cut passed into a rolling summary, off the
        turn's path: the request was already served with the truncate fit."""
        scfg = self._state.config.summarizer
        if self._state.config.compaction_strategy != "summarize":
            planner.take_dropped()
            return
        if self._summary_task is not None and not self._summary_task.done():
            return
        dropped = [i for i in planner.dropped if i.kind != "summary"]
        if len(dropped) < scfg.min_messages:
            return
        covered = planner.take_dropped()
        barriers = [
            i.ord
            for i in planner.pinned_items()
            if i.kind != "summary" and covered[0].ord < i.ord < covered[-1].ord
        ]
        if barriers:  # never fold a system or critical message into a summary
            covered = [i for i in covered if i.ord > max(barriers)]
        if not covered:
            return
        # the range starts right after the last system/critical item before it (or at
        # the prior summary): items the cut passed before this process loaded the view
        # are folded too, so the summary stands for everything before the tail
        start = max(
            (
                i.place
                for i in planner.pinned_items()
                if i.kind != "summary" and i.ord < covered[0].ord
            ),
            default=None,
        )
        prior = max(
            (i for i in planner.pinned_items() if i.kind == "summary" and i.ord < covered[0].ord),
            key=lambda i: i.ord,
            default=None,
        )
        if prior is not None and any(
            prior.ord < i.ord < covered[0].ord and i.kind != "summary"
            for i in planner.pinned_items()
        ):
            prior = None
        first = (start[0] + 1, 0) if start is not None else (1, 0)
        if prior is not None:
            first = prior.place
        task = asyncio.get_running_loop().create_task(self._summarize_range(covered, prior, first))
        self._summary_task = task
        self._state.ledger.keep(task)

    async def _summarize_range(
        self, covered: Sequence[ViewItem], prior: ViewItem | None, first: tuple[int, int]
    ) -> None:
        """The background summary, traced as a compaction (trigger ``background``)."""
        with telemetry.span(
            "compact_events summarize",
            {
                "gen_ai.operation.name": "compact_events",
                "gen_ai.conversation.id": self._s.session_id,
                "gen_ai.compaction.trigger": "background",
                "gen_ai.compaction.strategy": "summarize",
                "gen_ai.compaction.event_count": len(covered),
                "gen_ai.compaction.tokens_before": sum(i.tokens for i in covered),
                "contextledger.seq": self._s.head,
            },
        ) as span:
            await self._summarize_in_background(covered, prior, first, span)

    async def _summarize_in_background(
        self,
        covered: Sequence[ViewItem],
        prior: ViewItem | None,
        first: tuple[int, int],
        span: Any | None,
    ) -> None:
        scfg = self._state.config.summarizer
        counter = self._s.counter
        try:
            texts = [dict(i.message) for i in covered if i.kind != "summary"]
            prior_text = str(prior.message.get("content")) if prior is not None else None
            before = sum(i.tokens for i in covered) + (prior.tokens if prior else 0)
            result = await summarize(
                SummaryRequest(texts, prior_text, None, scfg.max_summary_tokens, scfg.prompt),
                self._model_specs(),
                counter=counter,
                tokens_before=before,
                on_fallback=self._s.on_fallback,
                offline_fallback=scfg.offline_fallback,
            )
            message = {"role": scfg.summary_role, "content": result.text}
            tokens = counter.count_message(message)
            last = covered[-1].place
            audit = {
                "covered": [first[0], last[0]],
                "prior_summary_seq": prior.seq if prior is not None else None,
                "model": result.model,
                "attempts": [
                    {"model": a.model, "ok": a.ok, "error_type": a.error_type, "error": a.error}
                    for a in result.attempts
                ],
                "tokens_before": before,
                "tokens_after": tokens,
                "prompt_version": result.prompt_version,
                "trigger": "background",
                "counter": counter.name,
            }
            payload = SummaryRecorded(
                first[0], last[0], message, tokens, audit, from_part=first[1], to_part=last[1]
            )
            await self._record(payload)
            if span is not None:
                span.set_attribute("gen_ai.compaction.tokens_after", tokens)
                span.set_attribute("gen_ai.compaction.outcome", "applied")
                span.set_attribute("contextledger.seq", self._s.head)
            self.summary_failure = None
            await self._s.hooks.emit(
                hk.SUMMARIZATION,
                {
                    "summary_length": len(result.text),
                    "model": result.model,
                    "tokens_before": before,
                    "tokens_after": tokens,
                    "background": True,
                },
            )
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the turn was served; record why no summary came
            failure = (
                exc
                if isinstance(exc, CompactionError)
                else CompactionError(f"background summary failed: {exc}", code="SUMMARY_FAILED")
            )
            self.summary_failure = failure
            if span is not None:
                span.set_attribute("gen_ai.compaction.outcome", "failed")
                span.set_attribute("error.type", failure.code)
            log.warning(
                "summary_failed",
                session_id=self._s.session_id,
                code=failure.code,
                error=str(exc),
                error_type=type(exc).__name__,
            )

    async def wait(self, wait_seconds: float = 30.0) -> None:
        """Wait for a summary in flight (up to ``wait_seconds``), else cancel it."""
        task = self._summary_task
        if task is None or task.done():
            return
        done, _ = await asyncio.wait({task}, timeout=wait_seconds)
        if not done:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
