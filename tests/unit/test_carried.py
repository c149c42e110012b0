"""What a request carries, as recall's search leaves it out (``recall.carried_seqs``)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from contextledger.core.view import ORD_STRIDE, ViewItem
from contextledger.recall import carried_seqs

kinds = st.sampled_from(["message", "message", "message", "synthetic", "summary", "ephemeral"])


@st.composite
def views(draw: st.DrawFn) -> tuple[ViewItem, ...]:
    seqs = sorted(draw(st.sets(st.integers(min_value=1, max_value=400), max_size=80)))
    out = []
    for seq in seqs:
        kind = draw(kinds)
        ref = (-seq, 0) if kind == "ephemeral" else (seq, draw(st.integers(0, 2)))
        out.append(ViewItem(ref, seq * ORD_STRIDE, {"role": "user", "content": "x"}, 1, kind=kind))
    if draw(st.booleans()):  # a view of messages only: the fast path
        out = [i for i in out if i.kind in ("message", "synthetic")]
    return tuple(out)


@given(view=views(), upto=st.integers(min_value=0, max_value=450))
def test_carried_seqs_are_the_ledger_messages_up_to_the_anchor(
    view: tuple[ViewItem, ...], upto: int
) -> None:
    expected = {
        i.ref[0] for i in view if 0 < i.ref[0] <= upto and i.kind in ("message", "synthetic")
    }
    assert carried_seqs(view, upto) == expected
