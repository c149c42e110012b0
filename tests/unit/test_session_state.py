"""``SessionState``: the one owner of a session handle's chain tip (``advance``/``adopt``)."""

from __future__ import annotations

from datetime import UTC, datetime

from hypothesis import given
from hypothesis import strategies as st

from contextledger.core.config import ContextConfig
from contextledger.session_state import SessionState
from contextledger.store.base import SessionInfo
from contextledger.store.memory import MemoryStore


class _Ledger:
    """Only ``store`` is read when a state is made (``SessionState.of``)."""

    def __init__(self) -> None:
        self.store = MemoryStore()


def info(head: int, last_hash: str, view_tokens: int) -> SessionInfo:
    return SessionInfo(
        "s", datetime(2026, 1, 1, tzinfo=UTC), None, {}, {}, head, last_hash, view_tokens, 0
    )


def state_at(head: int, last_hash: str = "h0", view_tokens: int = 0) -> SessionState:
    return SessionState.of(
        _Ledger(), info(head, last_hash, view_tokens), ContextConfig.from_mapping({})
    )  # type: ignore[arg-type]


STEPS = st.lists(
    st.tuples(
        st.integers(min_value=1, max_value=50),
        st.none() | st.text(alphabet="abcdef", min_size=1, max_size=4),
        st.none() | st.integers(min_value=0, max_value=10_000),
    ),
    max_size=20,
)


@given(start=st.integers(min_value=1, max_value=50), steps=STEPS)
def test_the_head_never_moves_back_and_the_pin_moves_with_each_hash(
    start: int, steps: list[tuple[int, str | None, int | None]]
) -> None:
    state = state_at(start, "h0", 7)
    for seq, last_hash, tokens in steps:
        state.advance(seq, last_hash, view_tokens=tokens)
    assert state.head == max([start, *(s for s, _, _ in steps)])
    pinned = [(s, h) for s, h, _ in steps if h is not None]
    assert state.known == (pinned[-1] if pinned else (start, "h0"))
    counted = [t for _, _, t in steps if t is not None]
    assert state.view_tokens == (counted[-1] if counted else 7)


def test_adopt_takes_the_stored_state_even_behind_the_handle() -> None:
    """A refresh after a purge and re-create: the stored head is lower, and it wins."""
    state = state_at(9, "h9", 100)
    state.advance(12, "h12", view_tokens=150)
    stored = info(2, "new", 5)
    state.adopt(stored)
    assert (state.head, state.known, state.view_tokens, state.info) == (2, (2, "new"), 5, stored)
