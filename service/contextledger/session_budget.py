"""Budget, limits and usage for one session, and the one warning a session without a model gets.

The arithmetic is pure (``core/budget.py``); this module adds what depends on the
session: its model and settings, the budget in force (the last request's
``token_budget``), warming the model catalogue off the event loop, and warning once
when the context window is assumed rather than known.
"""

from __future__ import annotations

from typing import Any, Protocol

import structlog

from contextledger._checks import check_text
from contextledger.core.budget import (
    Budget,
    Usage,
    resolve_budget,
    session_limits,
    thresholds_for,
    usage,
)
from contextledger.core.model_limits import ModelLimits
from contextledger.errors import InvalidArgument
from contextledger.session_state import SessionState

__all__ = ["DEFAULT_WINDOW", "BudgetedSession", "SessionBudget"]

#: the session's logger: the warning reads as the session's, as it did before the split
log = structlog.get_logger("contextledger.session")
#: The context window assumed for a session without a model (a warning says so).
DEFAULT_WINDOW = 8192


class BudgetedSession(Protocol):
    """What the budget needs of its ``Session`` (a port: no import cycle)."""

    session_id: str

    @property
    def model(self) -> str | None: ...
    def budget(
        self,
        token_budget: int | None = None,
        provider: Any | None = None,
        *,
        model: str | None = None,
        max_tokens: int | None = None,
    ) -> Budget: ...
    async def get_token_count(self) -> int: ...


class SessionBudget:
    """``Session.limits`` / ``budget`` / ``usage`` for one ``Session``."""

    def __init__(self, session: BudgetedSession, state: SessionState) -> None:
        self._s = session
        self._state = state
        self._warned_no_model = False

    def limits(self, model: str | None) -> ModelLimits:
        self._warn_if_no_model(model)
        return session_limits(self._state.config, self._s.model, model)

    def _warn_if_no_model(self, model: str | None) -> None:
        """Once per session: the window is assumed, not known, and how to make it known."""
        cfg = self._state.config
        if not (model or self._s.model or cfg.context_window) and not self._warned_no_model:
            self._warned_no_model = True
            log.warning(
                "session_without_model",
                session_id=self._s.session_id,
                assumed_context_window=cfg.max_tokens or DEFAULT_WINDOW,
                hint=(
                    "pass model= to ledger.session(...) or call session.set_model(...), "
                    "or set context_window in the session config"
                ),
            )

    def budget(
        self,
        token_budget: int | None,
        provider: Any | None,
        model: str | None,
        max_tokens: int | None,
    ) -> Budget:
        if token_budget is None:
            self._warn_if_no_model(model)
        return resolve_budget(
            self._state.config,
            self._s.model,
            token_budget=token_budget,
            provider=provider,
            model=model,
            max_tokens=max_tokens,
        )

    async def usage(self, model: str | None, max_tokens: int | None) -> Usage:
        if model is not None:
            check_text(model, "model")
        if max_tokens is not None and (
            isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens <= 0
        ):
            raise InvalidArgument("max_tokens must be a positive int", field="max_tokens")
        s = self._s
        if model is not None:
            await self._state.ledger.warm_model(model, self._state.config)
        b = s.budget(model=model, max_tokens=max_tokens)
        return usage(
            await s.get_token_count(),
            b,
            thresholds_for(model or s.model, self._state.config.profile),
        )
