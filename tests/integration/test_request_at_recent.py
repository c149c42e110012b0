"""``request_at`` a few messages back, without folding the history: the stored view with
the messages appended since taken off its tail, and the branch from its index
(``Session._recent_state``). A proxy retry in a process that did not build the request
(another worker) lands here: its reply is the one message after. Whatever path it takes,
the rebuilt request is the one sent then, recall block included."""

from __future__ import annotations

from contextledger import Ledger
from tests.integration.test_recall import FACT, QUESTION, planted, recall_blocks

BUDGET = 2000


async def test_a_request_a_few_messages_back_is_rebuilt_without_a_fold(ledger: Ledger) -> None:
    session = await planted(ledger)
    sent = await session.get_messages_for_request(token_budget=BUDGET)
    seq = session.request_seq
    assert [b for b in recall_blocks(sent) if FACT in b]  # a left-out fact came back
    assert await session._recent_state(seq) is not None  # at the head: the stored view
    await session.add_message({"role": "assistant", "content": "Use 18443."})
    await session.add_message({"role": "user", "content": "Thanks, and the timeout?"})
    await session.add_message({"role": "assistant", "content": "Five seconds."})
    recent = await session._recent_state(seq)
    assert recent is not None
    state, branch = recent
    assert state.head == seq and max(i.seq for i in state.view) == seq
    assert branch[-1] == seq
    assert await session.request_at(seq, token_budget=BUDGET) == sent
    # another kind of event since: folded, the same request
    await session.checkpoint("later")
    assert await session._recent_state(seq) is None
    assert await session.request_at(seq, token_budget=BUDGET) == sent


async def test_the_branch_as_of_the_request_bounds_what_it_recalls(ledger: Ledger) -> None:
    """The history rewritten without the fact: a request after it recalls nothing of it
    (off the branch), and the rebuilt request neither, though the fact's event is still
    in the ledger."""
    session = await planted(ledger)
    kept = [m for m in await session.get_messages() if m["content"] not in (FACT, "Noted.")]
    await session.set_messages(kept[:-1])  # without the fact, and without the question
    await session.add_message({"role": "user", "content": QUESTION})
    sent = await session.get_messages_for_request(token_budget=BUDGET)
    seq = session.request_seq
    await session.add_message({"role": "assistant", "content": "Which service?"})
    assert not [b for b in recall_blocks(sent) if FACT in b]
    assert await session._recent_state(seq) is not None
    rebuilt = await session.request_at(seq, token_budget=BUDGET)
    assert rebuilt == sent
    assert await session.branch_seq(len(kept) - 1) == seq
