"""The pure fold: literal scenarios, a reference model under Hypothesis, and store.record_events."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contextledger.core.chain import GENESIS_HASH, make_event
from contextledger.core.events import (
    CheckpointCreated,
    CompactionApplied,
    ConfigChanged,
    Event,
    MessageAppended,
    MessagesReplaced,
    ModelChanged,
    Payload,
    Pruned,
    RolledBack,
    SessionCleared,
    SessionCreated,
    SummaryRecorded,
)
from contextledger.core.projection import (
    ViewState,
    apply,
    check_append_target,
    fold,
    record_events,
    view_at,
)
from contextledger.core.view import ViewItem
from contextledger.errors import (
    ConcurrencyError,
    InvalidArgument,
    SeqOutOfRange,
    SessionNotFound,
)
from tests.examples import examples

T0 = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
SID = "s1"
M = 1_000_000  # ORD_STRIDE, written out


def u(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def a(text: str) -> dict[str, Any]:
    return {"role": "assistant", "content": text}


def build(payloads: Sequence[Payload]) -> list[Event]:
    """Events 1..n chained from the genesis hash."""
    events: list[Event] = []
    prev = GENESIS_HASH
    for seq, payload in enumerate(payloads, start=1):
        event = make_event(SID, seq, payload, prev, created_at=T0 + timedelta(seconds=seq))
        events.append(event)
        prev = event.hash
    return events


def msg(
    seq: int,
    message: dict[str, Any],
    tokens: int,
    *,
    critical: bool = False,
    kind: Any = "message",
    part: int = 0,
) -> ViewItem:
    return ViewItem(
        ref=(seq, part),
        ord=seq * M + part,
        message=message,
        tokens=tokens,
        critical=critical,
        kind=kind,
    )


def messages_of(items: Sequence[ViewItem]) -> list[Mapping[str, Any]]:
    return [i.message for i in items]


def one_by_one(events: Sequence[Event]) -> list[ViewState]:
    """States after each event, applying one at a time; state_at folds a prefix."""
    states: list[ViewState] = []
    state = ViewState()
    for event in events:
        state = apply(state, event, lambda s: fold(events[:s]))
        states.append(state)
    return states


# --------------------------------------------------------------------------- scenarios


def test_session_created_sets_model_and_config() -> None:
    events = build([SessionCreated("gpt-4o", {"k": 1}, {"owner": "x"})])
    assert fold(events) == ViewState(head=1, model="gpt-4o", config={"k": 1})


def test_append() -> None:
    events = build(
        [
            SessionCreated("m"),
            MessageAppended(u("hello"), 3),
            MessageAppended(a("hi"), 5, critical=True),
            MessageAppended(
                {"role": "tool", "tool_call_id": "c", "content": "?"}, 2, origin="synthetic"
            ),
        ]
    )
    expected = (
        ViewItem((2, 0), 2 * M, u("hello"), 3),
        ViewItem((3, 0), 3 * M, a("hi"), 5, critical=True),
        ViewItem(
            (4, 0),
            4 * M,
            {"role": "tool", "tool_call_id": "c", "content": "?"},
            2,
            kind="synthetic",
        ),
    )
    state = fold(events)
    assert state.view == expected
    assert state.branch == expected
    assert state.head == 4
    assert state.view_tokens == 10
    assert state.model == "m"


def test_set_messages_replaces_branch_and_view() -> None:
    events = build(
        [
            SessionCreated("m"),
            MessageAppended(u("old"), 4),
            MessagesReplaced((u("x"), a("y"), u("z")), (1, 2, 3), "chars"),
            MessageAppended(a("after"), 6),
        ]
    )
    expected = (
        ViewItem((3, 0), 3 * M, u("x"), 1),
        ViewItem((3, 1), 3 * M + 1, a("y"), 2),
        ViewItem((3, 2), 3 * M + 2, u("z"), 3),
        ViewItem((4, 0), 4 * M, a("after"), 6),
    )
    state = fold(events)
    assert state.view == expected == state.branch
    assert state.counter == "chars"
    assert state.view_tokens == 12


def test_set_messages_without_counter_keeps_the_previous_counter() -> None:
    events = build(
        [
            SessionCreated("m"),
            MessagesReplaced((u("x"),), (1,), "c1"),
            MessagesReplaced((u("y"),), (2,)),
        ]
    )
    assert fold(events).counter == "c1"
    assert fold(events).view == (ViewItem((3, 0), 3 * M, u("y"), 2),)


def test_clear_empties_branch_and_view_but_keeps_model_and_config() -> None:
    events = build(
        [
            SessionCreated("m", {"k": 1}),
            MessageAppended(u("a"), 1),
            SessionCleared(),
            MessageAppended(u("b"), 2),
        ]
    )
    assert fold(events, until=3) == ViewState(head=3, model="m", config={"k": 1})
    assert fold(events).view == (ViewItem((4, 0), 4 * M, u("b"), 2),)


def test_checkpoint_changes_only_the_head() -> None:
    events = build([SessionCreated("m"), MessageAppended(u("a"), 1), CheckpointCreated("cp")])
    before, after = fold(events, until=2), fold(events)
    assert after.head == 3
    assert after == ViewState(head=3, branch=before.branch, view=before.view, model="m")


def test_rollback_to_a_seq() -> None:
    events = build(
        [
            SessionCreated("m"),  # 1
            MessageAppended(u("a"), 1),  # 2
            MessageAppended(a("b"), 2),  # 3
            CheckpointCreated("cp"),  # 4
            MessageAppended(u("c"), 3),  # 5
            MessageAppended(a("d"), 4),  # 6
            RolledBack(4, 4, "cp"),  # 7
            MessageAppended(u("e"), 5),  # 8
        ]
    )
    ab = (ViewItem((2, 0), 2 * M, u("a"), 1), ViewItem((3, 0), 3 * M, a("b"), 2))
    state7 = fold(events, until=7)
    assert state7 == ViewState(head=7, branch=ab, view=ab, model="m")
    final = fold(events)
    assert final.view == (*ab, ViewItem((8, 0), 8 * M, u("e"), 5)) == final.branch
    assert final.view_tokens == 8


def test_rollback_to_the_session_start_empties_the_view() -> None:
    events = build([SessionCreated("m"), MessageAppended(u("a"), 1), RolledBack(1)])
    assert fold(events) == ViewState(head=3, model="m")


def test_rollback_to_the_head_changes_nothing_but_the_head() -> None:
    events = build([SessionCreated("m"), MessageAppended(u("a"), 1), RolledBack(2)])
    assert fold(events).view == (ViewItem((2, 0), 2 * M, u("a"), 1),)


NESTED: list[Payload] = [
    SessionCreated("m"),  # 1: []
    MessageAppended(u("a"), 1),  # 2: [a]
    MessageAppended(a("b"), 1),  # 3: [a b]
    MessageAppended(u("c"), 1),  # 4: [a b c]
    RolledBack(2),  # 5: [a]
    MessageAppended(a("d"), 1),  # 6: [a d]
    RolledBack(4),  # 7: [a b c]  (past the rollback, into the abandoned branch)
    RolledBack(6),  # 8: [a d]    (into the branch 7 abandoned)
    RolledBack(5),  # 9: [a]      (to a rollback event itself)
    MessageAppended(u("e"), 1),  # 10: [a e]
    RolledBack(8),  # 11: [a d]   (to a rollback that targeted a rollback)
    RolledBack(3),  # 12: [a b]
]
NESTED_VIEWS: dict[int, list[str]] = {
    1: [],
    2: ["a"],
    3: ["a", "b"],
    4: ["a", "b", "c"],
    5: ["a"],
    6: ["a", "d"],
    7: ["a", "b", "c"],
    8: ["a", "d"],
    9: ["a"],
    10: ["a", "e"],
    11: ["a", "d"],
    12: ["a", "b"],
}


def test_nested_rollbacks() -> None:
    events = build(NESTED)
    for seq, texts in NESTED_VIEWS.items():
        state = fold(events, until=seq)
        assert [i.message["content"] for i in state.view] == texts, seq
        assert [i.message["content"] for i in state.branch] == texts, seq
        assert state.head == seq
    assert fold(events).view == (
        ViewItem((2, 0), 2 * M, u("a"), 1),
        ViewItem((3, 0), 3 * M, a("b"), 1),
    )


def test_nested_rollbacks_one_by_one_match_fold() -> None:
    events = build(NESTED)
    for seq, state in enumerate(one_by_one(events), start=1):
        assert [i.message["content"] for i in state.view] == NESTED_VIEWS[seq]
        assert state == fold(events, until=seq) == fold(events[:seq])


def test_rollback_restores_model_and_config_of_the_target() -> None:
    # "The state right after to_seq": the model (and its recounted tokens) and the config
    # in force then come back with the view.
    events = build(
        [
            SessionCreated("m1", {"k": 1}),  # 1
            MessageAppended(u("a"), 3),  # 2
            ModelChanged("m2", "c2", (((2, 0), 30),)),  # 3
            ConfigChanged({"k": 2}),  # 4
            RolledBack(2),  # 5
        ]
    )
    state = fold(events)
    assert state == ViewState(
        head=5,
        branch=(ViewItem((2, 0), 2 * M, u("a"), 3),),
        view=(ViewItem((2, 0), 2 * M, u("a"), 3),),
        model="m1",
        config={"k": 1},
    )


def test_apply_rollback_needs_state_at() -> None:
    events = build([SessionCreated("m"), RolledBack(1)])
    with pytest.raises(ValueError, match="state_at"):
        apply(fold(events, until=1), events[1])


def test_apply_rejects_an_unknown_payload() -> None:
    @dataclass(frozen=True)
    class Strange(Payload):
        TYPE = "strange"

        def to_data(self) -> dict[str, Any]:
            return {}

    event = make_event(SID, 1, Strange(), GENESIS_HASH, created_at=T0)
    with pytest.raises(TypeError):
        apply(ViewState(), event)


SUMMARY_BASE: list[Payload] = [
    SessionCreated("m"),  # 1
    MessageAppended(u("u1"), 1),  # 2
    MessageAppended(a("a1"), 2),  # 3
    MessageAppended(u("u2"), 3),  # 4
    MessageAppended(a("a2"), 4),  # 5
    MessageAppended(u("u3"), 5),  # 6
]
S1 = u("summary of a1 u2")
S2 = u("summary of everything so far")


def test_summary_in_the_middle() -> None:
    events = build([*SUMMARY_BASE, SummaryRecorded(3, 4, S1, 7, {"model": "x"})])
    state = fold(events)
    assert state.view == (
        ViewItem((2, 0), 2 * M, u("u1"), 1),
        ViewItem((7, 0), 3 * M, S1, 7, kind="summary"),
        ViewItem((5, 0), 5 * M, a("a2"), 4),
        ViewItem((6, 0), 6 * M, u("u3"), 5),
    )
    assert state.view_tokens == 17
    # The branch (get_messages) is untouched by summaries.
    assert messages_of(state.branch) == [u("u1"), a("a1"), u("u2"), a("a2"), u("u3")]
    assert state.head == 7


def test_rolling_summary_covers_an_earlier_summary() -> None:
    events = build(
        [
            *SUMMARY_BASE,
            SummaryRecorded(3, 4, S1, 7),  # 7: [u1 S1 a2 u3]
            MessageAppended(a("a3"), 6),  # 8: [u1 S1 a2 u3 a3]
            SummaryRecorded(2, 7, S2, 2),  # 9: positions 2..7 = u1, S1 (at 3), a2, u3; not a3
        ]
    )
    state = fold(events)
    assert state.view == (
        ViewItem((9, 0), 2 * M, S2, 2, kind="summary"),
        ViewItem((8, 0), 8 * M, a("a3"), 6),
    )
    assert state.view_tokens == 8
    assert [i.kind for i in state.branch] == ["message"] * 6


def test_summary_of_the_tail() -> None:
    events = build([*SUMMARY_BASE, SummaryRecorded(5, 6, S1, 1)])
    assert fold(events).view == (
        ViewItem((2, 0), 2 * M, u("u1"), 1),
        ViewItem((3, 0), 3 * M, a("a1"), 2),
        ViewItem((4, 0), 4 * M, u("u2"), 3),
        ViewItem((7, 0), 5 * M, S1, 1, kind="summary"),
    )


def test_summary_over_replaced_messages_takes_the_first_parts_ord() -> None:
    events = build(
        [
            SessionCreated("m"),
            MessagesReplaced((u("x"), a("y")), (1, 2)),  # 2: parts 0, 1
            MessageAppended(u("z"), 3),  # 3
            SummaryRecorded(2, 2, S1, 1),  # 4
        ]
    )
    assert fold(events).view == (
        ViewItem((4, 0), 2 * M, S1, 1, kind="summary"),
        ViewItem((3, 0), 3 * M, u("z"), 3),
    )


def test_rollback_undoes_a_summary() -> None:
    events = build([*SUMMARY_BASE, SummaryRecorded(3, 4, S1, 7), RolledBack(6)])
    state = fold(events)
    assert messages_of(state.view) == [u("u1"), a("a1"), u("u2"), a("a2"), u("u3")]
    assert all(i.kind == "message" for i in state.view)


def test_compaction_drops_and_prunes() -> None:
    pruned = {"role": "user", "content": "[pruned]"}
    events = build(
        [
            *SUMMARY_BASE,
            CompactionApplied(
                "drop_prune",
                drop=((3, 0), (5, 0)),
                prune=(Pruned((4, 0), pruned, 1),),
                tokens_before=15,
                tokens_after=7,
            ),
        ]
    )
    state = fold(events)
    assert state.view == (
        ViewItem((2, 0), 2 * M, u("u1"), 1),
        ViewItem((4, 0), 4 * M, pruned, 1),
        ViewItem((6, 0), 6 * M, u("u3"), 5),
    )
    assert state.view_tokens == 7
    assert messages_of(state.branch) == [u("u1"), a("a1"), u("u2"), a("a2"), u("u3")]
    assert [i.tokens for i in state.branch] == [1, 2, 3, 4, 5]


def test_pruning_keeps_ref_ord_critical_flag_and_kind() -> None:
    events = build(
        [
            SessionCreated("m"),
            MessageAppended(u("keep"), 9, critical=True),
            MessageAppended(a("x"), 4),
            MessageAppended(u("y"), 4),
            SummaryRecorded(3, 3, S1, 8),
            CompactionApplied(
                "prune", prune=(Pruned((2, 0), u("k"), 1), Pruned((5, 0), u("short"), 2))
            ),
        ]
    )
    assert fold(events).view == (
        ViewItem((2, 0), 2 * M, u("k"), 1, critical=True),
        ViewItem((5, 0), 3 * M, u("short"), 2, kind="summary"),
        ViewItem((4, 0), 4 * M, u("y"), 4),
    )


def test_model_changed_recounts_the_view_only() -> None:
    events = build(
        [
            SessionCreated("m1"),
            MessageAppended(u("a"), 3),
            MessageAppended(a("b"), 5),
            ModelChanged("m2", "c2", (((2, 0), 10), ((99, 0), 1))),
        ]
    )
    state = fold(events)
    assert state.view == (ViewItem((2, 0), 2 * M, u("a"), 10), ViewItem((3, 0), 3 * M, a("b"), 5))
    assert state.branch == (ViewItem((2, 0), 2 * M, u("a"), 3), ViewItem((3, 0), 3 * M, a("b"), 5))
    assert (state.model, state.counter, state.view_tokens) == ("m2", "c2", 15)


def test_config_changed() -> None:
    events = build([SessionCreated("m", {"k": 1}), ConfigChanged({"k": 2, "j": [1]})])
    assert fold(events) == ViewState(head=2, model="m", config={"k": 2, "j": [1]})


def test_fold_until_equals_state_after_k_and_view_at() -> None:
    payloads: list[Payload] = [
        *SUMMARY_BASE,
        SummaryRecorded(3, 4, S1, 7),
        CheckpointCreated(),
        MessageAppended(a("a3"), 1),
        RolledBack(7),
    ]
    events = build(payloads)
    states = one_by_one(events)
    for k in range(1, len(events) + 1):
        assert fold(events, until=k) == states[k - 1] == fold(events[:k])
        assert view_at(events, k) == states[k - 1].view
    assert fold(events, until=0) == ViewState()
    assert fold([]) == ViewState()
    assert messages_of(view_at(events, 9)) == [u("u1"), S1, a("a2"), u("u3"), a("a3")]
    assert messages_of(view_at(events, 10)) == [u("u1"), S1, a("a2"), u("u3")]
    assert messages_of(view_at(events, 4)) == [u("u1"), a("a1"), u("u2")]


# --------------------------------------------------------------------------- reference model


@dataclass
class Snap:
    """An independent model of the projection: a full snapshot per seq."""

    branch: list[ViewItem] = field(default_factory=list)
    view: list[ViewItem] = field(default_factory=list)
    model: str | None = None
    config: Mapping[str, Any] = field(default_factory=dict)
    counter: str = ""

    def copy(self) -> Snap:
        return Snap(list(self.branch), list(self.view), self.model, self.config, self.counter)


def reference_step(history: list[Snap], seq: int, p: Payload) -> Snap:
    cur = history[-1].copy() if history else Snap()
    if isinstance(p, SessionCreated):
        return Snap(model=p.model, config=p.config)
    if isinstance(p, MessageAppended):
        item = ViewItem(
            (seq, 0),
            seq * M,
            p.message,
            p.tokens,
            p.critical,
            "synthetic" if p.origin == "synthetic" else "message",
        )
        cur.branch.append(item)
        cur.view.append(item)
    elif isinstance(p, MessagesReplaced):
        items = [
            ViewItem((seq, i), seq * M + i, m, t)
            for i, (m, t) in enumerate(zip(p.messages, p.tokens, strict=True))
        ]
        cur.branch, cur.view = items, list(items)
        if p.counter:
            cur.counter = p.counter
    elif isinstance(p, SessionCleared):
        cur.branch, cur.view = [], []
    elif isinstance(p, RolledBack):
        return history[p.to_seq - 1].copy()  # history[i] is the state after seq i + 1
    elif isinstance(p, SummaryRecorded):
        covered = [i for i, item in enumerate(cur.view) if p.from_seq <= item.ord // M <= p.to_seq]
        first = covered[0]
        summary = ViewItem((seq, 0), cur.view[first].ord, p.message, p.tokens, kind="summary")
        cur.view = [
            *(x for x in cur.view[:first]),
            summary,
            *(x for i, x in enumerate(cur.view) if i > first and i not in covered),
        ]
    elif isinstance(p, CompactionApplied):
        new: list[ViewItem] = []
        for item in cur.view:
            if item.ref in p.drop:
                continue
            match = [pr for pr in p.prune if pr.ref == item.ref]
            new.append(
                item
                if not match
                else ViewItem(
                    item.ref, item.ord, match[0].message, match[0].tokens, item.critical, item.kind
                )
            )
        cur.view = new
    elif isinstance(p, ModelChanged):
        counts = dict(p.recount)
        cur.view = [
            ViewItem(i.ref, i.ord, i.message, counts[i.ref], i.critical, i.kind)
            if i.ref in counts
            else i
            for i in cur.view
        ]
        cur.model, cur.counter = p.model, p.counter
    elif isinstance(p, ConfigChanged):
        cur.config = p.config
    return cur


TEXTS = st.sampled_from(["a", "b", "c", "hello", "ok", "fix it"])
TOKENS = st.integers(0, 20)


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[list[Payload], list[Snap]]:
    """A random admissible payload sequence and the reference state after each seq."""
    payloads: list[Payload] = [SessionCreated(draw(st.sampled_from(["m1", "m2", None])))]
    history = [reference_step([], 1, payloads[0])]
    for _ in range(draw(st.integers(0, 25))):
        seq = len(payloads) + 1
        cur = history[-1]
        kinds = [
            "append",
            "append",
            "append",
            "replace",
            "clear",
            "checkpoint",
            "rollback",
            "rollback",
            "config",
            "model",
        ]
        if cur.view:
            kinds += ["summary", "summary", "compact"]
        kind = draw(st.sampled_from(kinds))
        p: Payload
        if kind == "append":
            p = MessageAppended(
                {"role": draw(st.sampled_from(["user", "assistant"])), "content": draw(TEXTS)},
                draw(TOKENS),
                draw(st.booleans()),
                origin=draw(st.sampled_from([None, "synthetic"])),
            )
        elif kind == "replace":
            n = draw(st.integers(0, 3))
            p = MessagesReplaced(
                tuple(u(draw(TEXTS)) for _ in range(n)),
                tuple(draw(TOKENS) for _ in range(n)),
                draw(st.sampled_from(["", "c1", "c2"])),
            )
        elif kind == "clear":
            p = SessionCleared()
        elif kind == "checkpoint":
            p = CheckpointCreated(draw(st.none() | TEXTS))
        elif kind == "rollback":
            p = RolledBack(draw(st.integers(1, seq - 1)))
        elif kind == "config":
            p = ConfigChanged({"k": draw(st.integers(0, 3))})
        elif kind == "model":
            refs = [i.ref for i in cur.view]
            chosen = draw(st.lists(st.sampled_from(refs), unique=True)) if refs else []
            p = ModelChanged(
                draw(st.sampled_from(["m1", "m2", "m3"])),
                "c",
                tuple((r, draw(TOKENS)) for r in chosen),
            )
        elif kind == "summary":
            seqs = sorted({i.ord // M for i in cur.view})  # positions
            lo = draw(st.sampled_from(seqs))
            hi = draw(st.sampled_from([s for s in seqs if s >= lo]))
            p = SummaryRecorded(lo, hi, u(f"summary {lo}..{hi}"), draw(TOKENS))
        else:
            refs = [i.ref for i in cur.view]
            picked = draw(st.lists(st.sampled_from(refs), unique=True))
            cut = draw(st.integers(0, len(picked)))
            p = CompactionApplied(
                "test",
                tuple(picked[:cut]),
                tuple(Pruned(r, u("[pruned]"), draw(TOKENS)) for r in picked[cut:]),
            )
        payloads.append(p)
        history.append(reference_step(history, seq, p))
    return payloads, history


def as_state(seq: int, ref: Snap) -> ViewState:
    return ViewState(
        head=seq,
        branch=tuple(ref.branch),
        view=tuple(ref.view),
        model=ref.model,
        config=ref.config,
        counter=ref.counter,
    )


@settings(max_examples=examples(120), deadline=None)
@given(scenarios())
def test_fold_matches_the_reference_model(case: tuple[list[Payload], list[Snap]]) -> None:
    payloads, history = case
    events = build(payloads)
    incremental = one_by_one(events)
    for k in range(1, len(events) + 1):
        expected = as_state(k, history[k - 1])
        assert fold(events, until=k) == expected
        assert fold(events[:k]) == expected
        assert incremental[k - 1] == expected
        assert view_at(events, k) == expected.view
    final = fold(events)
    assert final == as_state(len(events), history[-1])
    assert all(i.kind != "summary" for i in final.branch)
    assert final.view_tokens == sum(i.tokens for i in history[-1].view)
    # The stores read the view back ORDER BY ord: it must already be in that order.
    ords = [i.ord for i in final.view]
    assert ords == sorted(set(ords))
    assert len({i.ref for i in final.view}) == len(final.view)


@settings(max_examples=examples(60), deadline=None)
@given(scenarios())
def test_advance_builds_the_same_chain_and_state(case: tuple[list[Payload], list[Snap]]) -> None:
    payloads, history = case
    events = build(payloads)
    state, prev = ViewState(), GENESIS_HASH
    made: list[Event] = []
    for seq, payload in enumerate(payloads, start=1):
        step = record_events(
            state,
            SID,
            prev,
            [payload],
            created_at=T0 + timedelta(seconds=seq),
            idempotency_key=None,
            state_at=lambda s: fold(made[:s]),
        )
        assert step.state == as_state(seq, history[seq - 1])
        (event,) = step.events
        made.append(event)
        state, prev = step.state, event.hash
    assert [e.hash for e in made] == [e.hash for e in events]


# --------------------------------------------------------------------------- store.record_events


def base_state() -> tuple[list[Event], ViewState]:
    events = build(SUMMARY_BASE)
    return events, fold(events)


def run_advance(payloads: Sequence[Payload], key: str | None = None) -> Any:
    events, state = base_state()
    return record_events(
        state,
        SID,
        events[-1].hash,
        payloads,
        created_at=T0,
        idempotency_key=key,
        state_at=lambda s: fold(events, until=s),
    )


@pytest.mark.parametrize("to_seq", [0, -1, 7, 100])
def test_advance_rejects_rollback_out_of_range(to_seq: int) -> None:
    with pytest.raises(SeqOutOfRange) as info:
        run_advance([RolledBack(to_seq)])
    assert info.value.details == {"seq": to_seq, "head": 6}


@pytest.mark.parametrize("to_seq", [1, 6])
def test_advance_accepts_rollback_at_the_range_ends(to_seq: int) -> None:
    step = run_advance([RolledBack(to_seq)])
    assert step.state.head == 7 and step.branch_reset


def test_advance_rejects_an_empty_summary_range() -> None:
    with pytest.raises(InvalidArgument, match="empty"):
        run_advance([SummaryRecorded(5, 4, S1, 1)])


@pytest.mark.parametrize(("lo", "hi"), [(7, 9), (0, 1), (100, 200)])
def test_advance_rejects_a_summary_range_covering_nothing_in_the_view(lo: int, hi: int) -> None:
    with pytest.raises(InvalidArgument, match="covers no item"):
        run_advance([SummaryRecorded(lo, hi, S1, 1)])


def test_advance_rejects_a_summary_of_items_already_dropped_from_the_view() -> None:
    with pytest.raises(InvalidArgument, match="covers no item"):
        run_advance(
            [CompactionApplied("drop", drop=((3, 0), (4, 0))), SummaryRecorded(3, 4, S1, 1)]
        )


@pytest.mark.parametrize(
    "payload",
    [
        CompactionApplied("d", drop=((2, 0), (9, 0))),
        CompactionApplied("d", drop=((2, 1),)),
        CompactionApplied("p", prune=(Pruned((42, 0), u("x"), 1),)),
    ],
)
def test_advance_rejects_compaction_of_unknown_refs(payload: CompactionApplied) -> None:
    with pytest.raises(InvalidArgument, match="not in the view"):
        run_advance([payload])


def test_advance_rejects_compaction_of_a_ref_replaced_by_a_summary() -> None:
    with pytest.raises(InvalidArgument, match="not in the view"):
        run_advance([SummaryRecorded(3, 4, S1, 1), CompactionApplied("d", drop=((3, 0),))])


def test_an_inadmissible_payload_late_in_a_batch_rejects_the_whole_batch() -> None:
    # Nothing is returned at all: the caller has no events to write.
    with pytest.raises(SeqOutOfRange):
        run_advance([MessageAppended(u("x"), 1), CheckpointCreated(), RolledBack(9)])


def test_a_batch_sees_its_own_earlier_events() -> None:
    # Seq 7 only exists once the first payload is applied; a summary of it is then admissible.
    step = run_advance([MessageAppended(u("x"), 1), SummaryRecorded(7, 7, S1, 2)])
    assert [e.seq for e in step.events] == [7, 8]
    assert messages_of(step.state.view) == [u("u1"), a("a1"), u("u2"), a("a2"), u("u3"), S1]


def test_rollback_to_a_seq_written_earlier_in_the_same_batch() -> None:
    # Admissibility accepts RolledBack(7) (the batch made seq 7), so the projection must be
    # the state right after 7. The store's state_at only knows persisted events (as
    # memory.py and postgres.py build it), so record_events has to supply batch states itself.
    step = run_advance([MessageAppended(u("x"), 1), SummaryRecorded(7, 7, S1, 2), RolledBack(7)])
    assert [e.seq for e in step.events] == [7, 8, 9]
    assert step.state.head == 9
    assert messages_of(step.state.view) == [u("u1"), a("a1"), u("u2"), a("a2"), u("u3"), u("x")]


def test_advance_puts_the_idempotency_key_on_the_last_event_and_chains_hashes() -> None:
    events, _ = base_state()
    payloads: list[Payload] = [
        MessageAppended(
            {"role": "tool", "tool_call_id": "c", "content": "none"}, 1, origin="synthetic"
        ),
        MessageAppended(u("next"), 2),
        CheckpointCreated("cp"),
    ]
    step = run_advance(payloads, key="req-1")
    assert [e.seq for e in step.events] == [7, 8, 9]
    assert [e.idempotency_key for e in step.events] == [None, None, "req-1"]
    prev = events[-1].hash
    for event, payload in zip(step.events, payloads, strict=True):
        key = "req-1" if payload is payloads[-1] else None
        assert (
            event.hash
            == make_event(SID, event.seq, payload, prev, created_at=T0, idempotency_key=key).hash
        )
        prev = event.hash
    assert step.state.head == 9
    assert not step.branch_reset
    assert step.state.model == "m" and step.state.config == base_state()[1].config


def test_advance_single_payload_gets_the_key() -> None:
    step = run_advance([MessageAppended(u("x"), 1)], key="k")
    assert [e.idempotency_key for e in step.events] == ["k"]


@pytest.mark.parametrize(
    ("payload", "reset"),
    [
        (MessagesReplaced((u("x"),), (1,)), True),
        (SessionCleared(), True),
        (RolledBack(3), True),
        (MessageAppended(u("x"), 1), False),
        (SummaryRecorded(2, 3, S1, 1), False),
        (CheckpointCreated(), False),
    ],
)
def test_advance_reports_branch_reset(payload: Payload, reset: bool) -> None:
    assert run_advance([payload]).branch_reset is reset


def test_advance_carries_config_and_model_changes_in_the_state() -> None:
    step = run_advance([ConfigChanged({"k": 5}), ModelChanged("m9", "c9")])
    assert step.state.config == {"k": 5}
    assert step.state.model == "m9" and step.state.counter == "c9"
    same_model = run_advance([ModelChanged("m", "c9")])
    assert same_model.state.model == "m" and same_model.state.counter == "c9"


@pytest.mark.parametrize(
    ("head", "last", "known", "at", "expected", "error"),
    [
        (5, "h5", (5, "h5"), None, None, None),  # the handle is current
        (7, "h7", (5, "h5"), "h5", None, None),  # the chain grew past it: fine
        (7, "h7", (5, "h5"), "other", None, SessionNotFound),  # a different chain
        (2, "h2", (5, "h5"), None, None, SessionNotFound),  # purged, re-created shorter
        (5, "x5", (5, "h5"), "x5", None, SessionNotFound),  # same seq, other hash
        (5, "h5", None, None, None, None),  # no pin
        (6, "h6", (5, "h5"), "h5", 5, ConcurrencyError),  # pinned seq moved on
        (5, "h5", (5, "h5"), None, 5, None),
    ],
)
def test_check_append_target(
    head: int,
    last: str,
    known: tuple[int, str] | None,
    at: str | None,
    expected: int | None,
    error: type[Exception] | None,
) -> None:
    def call() -> None:
        check_append_target(
            "s", head=head, last_hash=last, known=known, hash_at_known=at, expected_seq=expected
        )

    if error is None:
        call()
    else:
        with pytest.raises(error):
            call()
