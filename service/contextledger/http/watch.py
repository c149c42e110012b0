"""One poll per watched session, shared by all its event streams.

An event stream (``GET /v1/sessions/{id}/events/stream``) must see what any process
appends, so somebody has to ask the database. Each stream asking four times a second
costs N reads for N streams of one session; here one task per (tenant, session) reads
what is new and hands it to every stream that is caught up. A stream that is behind
(a catch-up from ``Last-Event-ID``) reads its own pages until it reaches the shared
batch. The task ends with the last stream.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import structlog

from contextledger import Event, Session

log = structlog.get_logger(__name__)
#: How many of the newest events a watch keeps for streams a little behind.
KEEP = 500


class Watch:
    """The newest events of one session, as the shared poll saw them."""

    def __init__(self, session: Session, interval: float, on_poll: Callable[[], None]) -> None:
        self._session = session
        self._interval = interval
        self._on_poll = on_poll
        self.head = session.head
        self.recent: deque[Event] = deque(maxlen=KEEP)
        self._changed = asyncio.Event()
        self.users = 0
        self.task: asyncio.Task[None] | None = None

    async def run(self) -> None:
        while True:
            try:
                self._on_poll()
                fresh = [e async for e in self._session.events(self.head + 1, self.head + KEEP)]
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a stream outlives a blip of the database
                log.warning("event_stream_poll_failed", error=type(exc).__name__)
                fresh = []
            if fresh:
                self.recent.extend(fresh)
                self.head = fresh[-1].seq
                self._changed.set()
                self._changed = asyncio.Event()
            await asyncio.sleep(self._interval if len(fresh) < KEEP else 0)

    async def wait(self, cursor: int, at_most: float) -> None:
        """Until the poll has seen ``cursor`` (the next seq a stream wants), or ``at_most``
        seconds (the stream has its client and its key to look at)."""
        if self.head >= cursor:
            return
        changed = self._changed
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(at_most):
                await changed.wait()

    def since(self, cursor: int) -> list[Event] | None:
        """The shared events from ``cursor`` on, or None when the stream is further behind
        than the watch keeps (it reads for itself)."""
        if not self.recent or self.recent[0].seq > cursor:
            return None if cursor <= self.head else []
        return [e for e in self.recent if e.seq >= cursor]


class Watches:
    """The live watches of a service process, by (tenant, session id)."""

    def __init__(self, interval: float, on_poll: Callable[[], None] = lambda: None) -> None:
        self.interval = interval
        self._on_poll = on_poll
        self._live: dict[tuple[str, str], Watch] = {}

    @asynccontextmanager
    async def watching(self, tenant: str, session: Session) -> AsyncIterator[Watch]:
        key = (tenant, session.session_id)
        watch = self._live.get(key)
        if watch is None:
            watch = self._live[key] = Watch(session, self.interval, self._on_poll)
            watch.task = asyncio.create_task(watch.run(), name=f"watch {session.session_id}")
        watch.users += 1
        try:
            yield watch
        finally:
            watch.users -= 1
            if not watch.users:
                del self._live[key]
                assert watch.task is not None
                watch.task.cancel()

    def __len__(self) -> int:
        return len(self._live)
