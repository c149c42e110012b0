"""Opportunistic group commit for message appends to different sessions.

An append that finds fewer than ``max_inflight`` statements in flight runs at
once, alone (no added latency when appends come one at a time). Appends that
arrive while statements are in flight wait in a queue; the next statement takes
the whole queue as one multi-row append: one round trip and one commit for all.
Each row keeps its own conditional head check, so a batch is exactly as strict
as the appends it carries; if the statement fails as a whole (an idempotency
key reused, a deadlock with another process), every row is retried alone so
each caller gets its own answer.

A session is never twice in one batch: its appends are serialized by the store's
per-session lock, held until the append's result is known.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

Row = tuple[Any, ...]
RunOne = Callable[[Row], Awaitable[Any]]
RunMany = Callable[[Sequence[Row]], Awaitable[dict[str, Any]]]


@dataclass
class _Pending:
    row: Row
    future: asyncio.Future[Any] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


class AppendBatcher:
    """Runs single appends at once and gathers the concurrent ones into batches."""

    def __init__(
        self,
        run_one: RunOne,
        run_many: RunMany,
        *,
        max_inflight: int = 2,
        max_batch: int = 256,
        rolled_back: Callable[[BaseException], bool] = lambda exc: True,
    ) -> None:
        self._rolled_back = rolled_back
        self._run_one = run_one
        self._run_many = run_many
        self._max_inflight = max_inflight
        self._max_batch = max_batch
        self._queue: list[_Pending] = []
        self._inflight = 0
        self._quiet = asyncio.Event()  # set while nothing is queued or in flight
        self._quiet.set()
        self._tasks: set[asyncio.Task[None]] = set()
        self.batches = 0  # statements that carried more than one append (observability)

    async def submit(self, row: Row) -> Any:
        """The append's result (the row's value, ``None`` if its head check failed)."""
        self._quiet.clear()
        if self._inflight < self._max_inflight and not self._queue:
            self._inflight += 1
            try:
                return await self._run_one(row)
            finally:
                self._inflight -= 1
                self._drain()
        pending = _Pending(row)
        self._queue.append(pending)
        self._drain()
        try:
            return await pending.future
        except asyncio.CancelledError:
            if pending in self._queue:  # never sent: nothing will be written
                self._queue.remove(pending)
                self._drain()
            raise

    async def wait_idle(self) -> None:
        """Until every accepted append has its answer (``close`` waits for this)."""
        await self._quiet.wait()

    def _drain(self) -> None:
        while self._queue and self._inflight < self._max_inflight:
            batch, self._queue = self._queue[: self._max_batch], self._queue[self._max_batch :]
            self._inflight += 1
            task = asyncio.get_running_loop().create_task(self._flush(batch))
            self._tasks.add(task)  # asyncio keeps only weak references to tasks
            task.add_done_callback(self._tasks.discard)
        if not self._queue and not self._inflight:
            self._quiet.set()

    async def _flush(self, batch: list[_Pending]) -> None:
        batch = [p for p in batch if not p.future.done()]  # cancelled callers: not sent
        try:
            if not batch:
                return
            if len(batch) == 1:
                await self._settle(batch[0])
                return
            try:
                results = await self._run_many([p.row for p in batch])
            except Exception as exc:
                if not self._rolled_back(exc):  # e.g. the connection dropped: maybe committed
                    for p in batch:
                        if not p.future.done():
                            p.future.set_exception(exc)
                    return
                # One row spoiled the statement: let each row answer for itself.
                await asyncio.gather(*(self._settle(p) for p in batch))
                return
            self.batches += 1
            for p in batch:
                if not p.future.done():
                    p.future.set_result(results.get(p.row[0]))
        except BaseException as exc:  # cancelled mid-flight: nobody may wait forever
            for p in batch:
                if not p.future.done():
                    p.future.set_exception(exc)
            raise
        finally:
            self._inflight -= 1
            self._drain()

    async def _settle(self, pending: _Pending) -> None:
        try:
            result = await self._run_one(pending.row)
        except Exception as exc:
            if not pending.future.done():
                pending.future.set_exception(exc)
        else:
            if not pending.future.done():
                pending.future.set_result(result)
