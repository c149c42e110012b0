"""An event loop on a thread of the adapter's own, for calls from loops that are not
the ledger's (another thread's loop, ``Runner.run_sync``) and from plain sync code.

A ledger's connection pool belongs to the loop that opened it; using it from another
loop fails ("attached to a different loop") or worse. So an adapter keeps the ledger
where it lives and hands the work to that loop: from async code it awaits the result
without blocking its own loop, from sync code it waits on it. The loop thread is the
adapter's alone, so nothing a caller does can block it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

from contextledger.errors import InvalidArgument

__all__ = ["LoopThread", "running_loop"]

T = TypeVar("T")


def running_loop() -> asyncio.AbstractEventLoop | None:
    """The event loop running in this thread, if any."""
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


class LoopThread:
    """An event loop running on a daemon thread; ``stop()`` ends both."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        if threading.current_thread() is self._thread:
            coro.close()
            raise InvalidArgument(
                "a call from the adapter's own loop thread would wait on itself",
                code="SYNC_CALL_IN_EVENT_LOOP",
            )
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    async def run_async(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on this loop; the caller's loop keeps running meanwhile (a
        cancelled caller cancels the work)."""
        return await asyncio.wrap_future(self.submit(coro))

    def run_sync(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on this loop and wait for it (blocks the calling thread only)."""
        return self.submit(coro).result()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and not self.loop.is_closed()

    def stop(self) -> None:
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=10)
            if not self._thread.is_alive():
                self.loop.close()
