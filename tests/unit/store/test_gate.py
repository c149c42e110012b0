"""The recall search's gate: which seqs a request leaves out (``gate_gaps``)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from contextledger.store.postgres import MAX_GATE_GAPS, gate_gaps


@given(
    upto=st.integers(min_value=0, max_value=3 * MAX_GATE_GAPS),
    carried=st.sets(st.integers(min_value=-2, max_value=4 * MAX_GATE_GAPS)),
)
def test_the_gaps_are_exactly_the_seqs_not_carried_or_none_beyond_the_bound(
    upto: int, carried: set[int]
) -> None:
    missing = [s for s in range(1, upto + 1) if s not in carried]
    gaps = gate_gaps(upto, carried)
    if len(missing) > MAX_GATE_GAPS:
        assert gaps is None
    else:
        assert gaps == missing
    assert gate_gaps(upto, list(carried)) == gaps  # any collection, same answer
