"""Where a rollback goes: a ``Checkpoint``, a checkpoint label or a seq -> ``RolledBack``.

The target is resolved before anything is written, so a bad one raises a typed error
(``InvalidArgument``, ``CheckpointNotFound``) and the ledger stays as it was. The
checkpoints are read only when the target names one: a rollback to a seq reads nothing.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from contextledger._checks import check_seq, check_text
from contextledger.core.events import RolledBack
from contextledger.errors import CheckpointNotFound, InvalidArgument
from contextledger.store.base import Checkpoint

__all__ = ["fork_seq", "rollback_event"]


async def rollback_event(
    to: Checkpoint | str | int,
    checkpoints: Callable[[], Awaitable[list[Checkpoint]]],
    session_id: str,
) -> RolledBack:
    """The event that rolls ``session_id`` back to ``to`` (``checkpoints`` lists its own)."""
    if isinstance(to, Checkpoint):
        if (to.seq, to.label) not in {(c.seq, c.label) for c in await checkpoints()}:
            raise CheckpointNotFound(
                f"no checkpoint at seq {to.seq} labelled {to.label!r} in session {session_id!r}",
                seq=to.seq,
                label=to.label,
            )
        return RolledBack(to.seq, to.seq, to.label)
    if isinstance(to, bool):
        raise InvalidArgument("rollback takes a Checkpoint, a label or a seq")
    if isinstance(to, int):
        return RolledBack(check_seq(to, "to") or 0, None, None)
    if isinstance(to, str):
        check_text(to, "label")
        matches = [c for c in await checkpoints() if c.label == to]
        if not matches:
            raise CheckpointNotFound(
                f"no checkpoint labelled {to!r} in session {session_id!r}", label=to
            )
        return RolledBack(matches[-1].seq, matches[-1].seq, to)
    raise InvalidArgument("rollback takes a Checkpoint, a label or a seq")


async def fork_seq(
    at: Checkpoint | str | int | None,
    checkpoints: Callable[[], Awaitable[list[Checkpoint]]],
    session_id: str,
    head: int,
) -> int:
    """The seq a fork of ``session_id`` stands on: ``at`` resolved as a rollback target
    is (a ``Checkpoint``, a checkpoint label, a seq), the head when ``None``."""
    if at is None:
        return head
    if isinstance(at, int) and not isinstance(at, bool) and not 1 <= at <= head:
        raise InvalidArgument(f"at must be a seq in 1..{head}, got {at}", field="at")
    return (await rollback_event(at, checkpoints, session_id)).to_seq
