"""The recall search's gate: which seqs a request leaves out (``gate_gaps``)."""

from __future__ import annotations

from itertools import pairwise

from hypothesis import given
from hypothesis import strategies as st

from contextledger.store.postgres import MAX_GATE_GAPS, gate_gaps, seq_ranges


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


@given(seqs=st.lists(st.integers(min_value=-3, max_value=400), max_size=300))
def test_seq_ranges_hold_exactly_the_seqs_in_few_ranges(seqs: list[int]) -> None:
    literal = seq_ranges(seqs)
    assert literal.startswith("{") and literal.endswith("}")
    bounds = [tuple(map(int, r.strip("[]").split(","))) for r in literal[1:-1].split("],[") if r]
    held = {s for lo, hi in bounds for s in range(lo, hi + 1)}
    assert held == set(seqs)
    # one range per run of consecutive seqs, in order, none touching the next
    assert all(hi + 1 < lo for (_, hi), (lo, _) in pairwise(bounds))
    assert seq_ranges(set(seqs)) == literal
