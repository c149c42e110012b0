"""Argument checks the framework adapters share: each raises its framework's own error
type (``error``), as the framework's users expect, with the same message."""

from __future__ import annotations

from collections.abc import Callable


def check_token_budget(token_budget: object, error: Callable[[str], Exception]) -> None:
    """``token_budget`` is ``None`` (the session's budget) or a positive int, not a bool."""
    if token_budget is not None and (
        isinstance(token_budget, bool) or not isinstance(token_budget, int) or token_budget <= 0
    ):
        raise error("token_budget must be a positive int")
