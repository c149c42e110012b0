"""Opt-in retry for appends that carry an idempotency key (safe by construction: a
retried append that had been written is found by its key and not written again)."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from contextledger.errors import InvalidArgument, LedgerUnavailable

T = TypeVar("T")


@dataclass(frozen=True)
class RetryPolicy:
    """Bounded exponential backoff with full jitter, on ``LedgerUnavailable`` only."""

    attempts: int = 5
    base_delay: float = 0.05
    max_delay: float = 2.0

    def __post_init__(self) -> None:
        if isinstance(self.attempts, bool) or not isinstance(self.attempts, int):
            raise InvalidArgument("attempts must be an int >= 1", field="attempts")
        if self.attempts < 1 or not 0 <= self.base_delay <= self.max_delay <= 60:
            raise InvalidArgument(
                "need attempts >= 1 and 0 <= base_delay <= max_delay <= 60", field="retry"
            )

    def delay(self, attempt: int) -> float:
        """Seconds to wait before retry ``attempt`` (0-based): full jitter over a capped
        exponential, so writers that failed together do not retry together."""
        return random.uniform(0, min(self.max_delay, self.base_delay * 2**attempt))

    async def run(self, call: Callable[[], Awaitable[T]]) -> T:
        """Await ``call()``, again after ``LedgerUnavailable`` up to ``attempts`` times;
        the last failure propagates. Only for calls safe to repeat (keyed appends)."""
        for attempt in range(self.attempts - 1):
            try:
                return await call()
            except LedgerUnavailable:
                await asyncio.sleep(self.delay(attempt))
        return await call()
