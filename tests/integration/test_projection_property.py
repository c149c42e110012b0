"""Property: for any sequence of operations, inline view == fold(events) == view_at(head)."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contextledger import InvalidArgument, Ledger, Session
from contextledger.core.projection import fold

_ids = itertools.count()

text = st.text(alphabet=st.characters(codec="utf-8", exclude_characters="\x00"), max_size=30)
message = st.builds(
    lambda role, content: {"role": role, "content": content},
    st.sampled_from(["user", "assistant", "system"]),
    text,
)

op = st.one_of(
    st.tuples(st.just("append"), message, st.booleans()),
    st.tuples(st.just("append"), message, st.booleans()),
    st.tuples(st.just("append"), message, st.booleans()),
    st.tuples(st.just("replace"), st.lists(message, max_size=4)),
    st.tuples(st.just("clear")),
    st.tuples(st.just("checkpoint"), st.none() | st.sampled_from(["a", "b"])),
    st.tuples(st.just("rollback"), st.floats(0, 1)),
    st.tuples(st.just("summary"), st.floats(0, 1), st.floats(0, 1)),
)


async def apply_op(session: Session, step: Any) -> None:
    """One generated operation (``op``) on ``session``; a summary whose range would
    reorder the view is refused and writes nothing."""
    kind = step[0]
    if kind == "append":
        await session.add_message(step[1], critical=step[2])
    elif kind == "replace":
        await session.set_messages(step[1])
    elif kind == "clear":
        await session.clear()
    elif kind == "checkpoint":
        await session.checkpoint(step[1])
    elif kind == "rollback":
        await session.rollback(1 + int(step[1] * (session.head - 1)))
    elif kind == "summary":
        view = await session.view_items()
        seqs = sorted({i.position for i in view})
        if seqs:
            a, b = sorted(
                (seqs[int(step[1] * (len(seqs) - 1))], seqs[int(step[2] * (len(seqs) - 1))])
            )
            covered = [n for n, i in enumerate(view) if a <= i.position <= b]
            if covered[-1] - covered[0] + 1 == len(covered):
                await session.record_summary(a, b, f"summary of {a}..{b}")
            else:  # a range that would reorder the view is refused, nothing written
                head = session.head
                with pytest.raises(InvalidArgument, match="contiguous"):
                    await session.record_summary(a, b, "reordering summary")
                assert session.head == head


async def run(ledger: Ledger, ops: list[Any]) -> None:
    session = await ledger.session(f"prop-{next(_ids)}")
    for step in ops:
        await apply_op(session, step)
    events = [e async for e in session.events()]
    assert [e.seq for e in events] == list(range(1, session.head + 1))
    folded = fold(events)
    inline = await session.view_items()
    assert [(i.ref, i.ord, i.kind, dict(i.message), i.tokens, i.critical) for i in inline] == [
        (i.ref, i.ord, i.kind, dict(i.message), i.tokens, i.critical) for i in folded.view
    ]
    assert await session.view_at(session.head) == [dict(i.message) for i in folded.view]
    assert await session.get_messages() == [dict(i.message) for i in folded.branch]
    assert await session.get_token_count() == folded.view_tokens
    assert (await session.verify()).ok
    assert all(r.ok for r in await ledger.rebuild(session.session_id))


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(ops=st.lists(op, max_size=25))
async def test_inline_view_equals_fold_equals_view_at_head(ledger: Ledger, ops: list[Any]) -> None:
    await run(ledger, ops)
