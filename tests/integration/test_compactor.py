"""Rolling summaries end to end: ``Session`` → litellm over real HTTP → the fake server.

Every test drives ``Ledger``/``Session`` against both stores (the ``ledger``
fixture: a real PostgreSQL and the memory store) and the scripted OpenAI-compatible
server of ``tests.fakellm``. Nothing of ours or of litellm is mocked.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from contextledger import (
    Ledger,
)
from contextledger.compactor import PRE_COMPACT_LABEL
from contextledger.core.summary.offline import OFFLINE_MODEL, OFFLINE_VERSION
from contextledger.core.summary.prompt import PROMPT_VERSION
from contextledger.core.view import ViewItem
from contextledger.errors import CompactionError
from contextledger.hooks import CompactContext, CompactDecision
from contextledger.session import Session
from tests.fakellm import (
    FakeLLM,
    context_exceeded,
    empty,
    long_answer,
    ok,
    running_fake_llm,
    server_error,
    slow,
)

SUMMARY_1 = "## Task overview\n- first rolling summary of the ledger port (S1-MARK)"
SUMMARY_2 = "## Task overview\n- second rolling summary, folding S1-MARK in (S2-MARK)"
TIMEOUT = 0.5


@pytest.fixture(name="fake_llm")
def _fake_llm() -> Iterator[FakeLLM]:
    """``tests.fakellm.fake_llm`` (a fresh scripted server per test), bound locally."""
    with running_fake_llm() as fake:
        yield fake


@pytest.fixture(scope="module", autouse=True)
def _warm_litellm() -> None:
    """Import litellm and open one HTTP call up front, so a 0.5 s timeout in a test
    measures the fake server and not litellm's first-use imports."""
    from contextledger.core.summary.prompt import SummaryRequest
    from contextledger.core.tokens import CharsCounter
    from contextledger.summarizer import ModelSpec, summarize

    with running_fake_llm() as fake:
        asyncio.run(
            summarize(
                SummaryRequest([{"role": "user", "content": "warm up " * 200}]),
                [ModelSpec("openai/warm", api_base=fake.base_url, api_key="test", timeout=30)],
                counter=CharsCounter(),
                tokens_before=1000,
            )
        )


# ------------------------------------------------------------------ helpers


def model(
    fake: FakeLLM, name: str, *, timeout: float = TIMEOUT, num_retries: int = 0
) -> dict[str, Any]:
    return {
        "model": f"openai/{name}",
        "api_base": fake.base_url,
        "api_key": "test",
        "timeout": timeout,
        "num_retries": num_retries,
    }


def config(fake: FakeLLM, *names: str, num_retries: int = 0, **summarizer: Any) -> dict[str, Any]:
    chain = [model(fake, n, num_retries=num_retries) for n in (names or ("primary", "secondary"))]
    return {
        "compaction_strategy": "summarize",
        "token_counter": "chars",
        "summarizer": {"models": chain, **summarizer},
    }


def user(i: int) -> dict[str, Any]:
    return {
        "role": "user",
        "content": f"U-{i:03d} please look at the ledger port, step {i}. "
        + "The migration needs care. " * 4,
    }


def assistant(i: int) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": f"A-{i:03d} done with step {i}. " + "I checked the schema and the indexes. " * 4,
    }


async def turns(session: Session, start: int, stop: int) -> list[int]:
    """Append user/assistant turns ``start..stop-1``; return their seqs."""
    seqs: list[int] = []
    for i in range(start, stop):
        for message in (user(i), assistant(i)):
            seq = await session.add_message(message)
            assert seq is not None
            seqs.append(seq)
    return seqs


async def new_session(
    ledger: Ledger,
    fake: FakeLLM,
    *names: str,
    system: bool = True,
    n_turns: int = 10,
    num_retries: int = 0,
    **summarizer: Any,
) -> Session:
    session = await ledger.session(
        "s", config=config(fake, *names, num_retries=num_retries, **summarizer)
    )
    if system:
        await session.add_message({"role": "system", "content": "You port databases."})
    await turns(session, 0, n_turns)
    return session


async def typed(session: Session, kind: str) -> list[Any]:
    return [e async for e in session.events() if e.type == kind]


async def summaries_in_view(session: Session) -> list[ViewItem]:
    return [i for i in await session.view_items() if i.kind == "summary"]


def text_of(messages: list[dict[str, Any]]) -> str:
    return "\n".join(str(m.get("content")) for m in messages)


def tokens(session: Session, messages: list[dict[str, Any]]) -> int:
    return sum(session.counter.count_message(m) for m in messages)


@dataclass(frozen=True)
class Provider:
    """The bit of an Amplifier provider the request view looks at."""

    default_model: str


@pytest.fixture
def fallbacks() -> Iterator[list[tuple[str, str, str]]]:
    yield []


# ------------------------------------------------------------------ the happy path


async def test_compact_folds_everything_before_the_tail(ledger: Ledger, fake_llm: FakeLLM) -> None:
    fake_llm.script("primary", [ok(SUMMARY_1)])
    session = await new_session(ledger, fake_llm)
    history = await session.get_messages()
    before = await session.view_items()
    head = session.head

    saved = await session.compact()

    # 21 messages: system, then 10 turns. Default tail: the last 5 turns (10 messages).
    covered = before[1:11]
    assert saved == sum(i.tokens for i in covered) - session.counter.count_message(
        {"role": "user", "content": SUMMARY_1}
    )
    events: list[Any] = [e async for e in session.events(head + 1)]
    assert [e.type for e in events] == ["checkpoint.created", "summary.recorded"]
    assert events[0].payload.label == PRE_COMPACT_LABEL
    summary = events[1].payload
    assert (summary.from_seq, summary.to_seq) == (covered[0].seq, covered[-1].seq)
    assert summary.message == {"role": "user", "content": SUMMARY_1}
    audit = summary.audit
    assert audit["covered"] == [covered[0].seq, covered[-1].seq]
    assert audit["prior_summary_seq"] is None
    assert audit["model"] == "openai/primary"
    assert [(a["model"], a["ok"]) for a in audit["attempts"]] == [("openai/primary", True)]
    assert audit["tokens_before"] == sum(i.tokens for i in covered)
    assert audit["tokens_after"] == summary.tokens < audit["tokens_before"]
    assert audit["prompt_version"] == PROMPT_VERSION
    assert audit["custom_instructions"] is None
    assert audit["trigger"] == "manual"

    # history untouched; the view is system + summary + tail; the ledger keeps everything
    assert await session.get_messages() == history
    view = await session.view()
    assert view == [history[0], {"role": "user", "content": SUMMARY_1}, *history[11:]]
    appended = await typed(session, "message.appended")
    assert [e.payload.message for e in appended] == history
    assert await session.get_token_count() == sum(i.tokens for i in await session.view_items())

    # what the model saw: the covered turns as a transcript, not the tail, not the system
    sent = fake_llm.calls("primary")
    assert len(sent) == 1
    prompt = sent[0].text
    assert all(f"U-{i:03d}" in prompt and f"A-{i:03d}" in prompt for i in range(5))
    assert not any(f"U-{i:03d}" in prompt for i in range(5, 10))
    assert "You port databases." not in prompt
    assert "<prior_summary>" not in prompt


async def test_preserve_recent_turns_sets_the_tail(ledger: Ledger, fake_llm: FakeLLM) -> None:
    fake_llm.script("primary", [ok(SUMMARY_1)])
    session = await new_session(ledger, fake_llm, preserve_recent_turns=2)
    history = await session.get_messages()
    await session.compact()
    assert await session.view() == [
        history[0],
        {"role": "user", "content": SUMMARY_1},
        *history[-4:],
    ]


async def test_too_few_messages_before_the_tail_writes_nothing(
    ledger: Ledger, fake_llm: FakeLLM
) -> None:
    # 6 turns, tail of 5: one turn (2 messages) before it, below min_messages=4.
    session = await new_session(ledger, fake_llm, n_turns=6)
    head, view = session.head, await session.view()
    assert await session.compact() == 0
    assert session.head == head
    assert await session.view() == view
    assert fake_llm.requests == []


async def test_too_few_messages_writes_nothing_even_over_budget(
    ledger: Ledger, fake_llm: FakeLLM
) -> None:
    """'At least min_messages or nothing happens' holds under a tight budget too: the
    deterministic fallback is for failed models, not for 'not worth summarizing', and
    must not cut into the preserved tail."""
    session = await new_session(ledger, fake_llm, n_turns=6)
    head, view = session.head, await session.view()
    assert await session.get_token_count() > 300
    assert await session.compact(token_budget=300) == 0
    assert session.head == head
    assert await session.view() == view
    assert fake_llm.requests == []


async def test_min_messages_is_configurable(ledger: Ledger, fake_llm: FakeLLM) -> None:
    fake_llm.script("primary", [ok(SUMMARY_1)])
    session = await new_session(ledger, fake_llm, n_turns=6, min_messages=2)
    history = await session.get_messages()
    assert await session.compact() > 0
    assert await session.view() == [
        history[0],
        {"role": "user", "content": SUMMARY_1},
        *history[3:],
    ]


def _tool_turn(n: int, calls: int) -> list[dict[str, Any]]:
    """A human request, then an agent loop of tool batches, then an answer."""
    out: list[dict[str, Any]] = [{"role": "user", "content": f"U-{n:03d} run the checks " * 3}]
    for step in range(2):
        ids = [f"call_{n}_{step}_{k}" for k in range(calls)]
        out.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": i, "type": "function", "function": {"name": "grep", "arguments": "{}"}}
                    for i in ids
                ],
            }
        )
        out.extend(
            {"role": "tool", "tool_call_id": i, "content": f"result of {i} " * 6} for i in ids
        )
    out.append({"role": "assistant", "content": f"A-{n:03d} all checks pass " * 3})
    return out


def _check_units(view: list[dict[str, Any]]) -> None:
    """Every tool result follows its call; every call has all its results after it."""
    open_ids: set[str] = set()
    for message in view:
        if message.get("role") == "tool":
            assert message["tool_call_id"] in open_ids, f"orphan result {message}"
            open_ids.discard(message["tool_call_id"])
            continue
        assert not open_ids, f"calls {open_ids} left unanswered before {message}"
        open_ids = {c["id"] for c in message.get("tool_calls") or ()}
    assert not open_ids


@pytest.mark.parametrize("preserve", [1, 2, 3, 4, 7])
async def test_a_tool_unit_is_never_split(ledger: Ledger, fake_llm: FakeLLM, preserve: int) -> None:
    session = await ledger.session(
        "s", config=config(fake_llm, preserve_recent_turns=preserve, min_messages=2)
    )
    for n in range(6):
        for message in _tool_turn(n, calls=1 + n % 3):
            await session.add_message(message)
    items = await session.view_items()
    assert await session.compact() > 0
    [event] = await typed(session, "summary.recorded")
    lo, hi = event.payload.audit["covered"]
    inside = [i for i in items if lo <= i.seq <= hi]
    after = [i for i in items if i.seq > hi]
    assert inside and after
    assert after[0].role != "tool"
    _check_units([dict(i.message) for i in inside])
    _check_units([dict(i.message) for i in after])
    view = await session.view()
    _check_units(view[1:])
    assert view[0]["content"] == event.payload.message["content"]


async def test_system_and_critical_messages_are_never_folded(
    ledger: Ledger, fake_llm: FakeLLM
) -> None:
    fake_llm.script("primary", [ok(SUMMARY_1)])
    session = await new_session(ledger, fake_llm, n_turns=3)
    critical = {"role": "user", "content": "CRIT: never touch the production database."}
    crit_seq = await session.add_message(critical, critical=True)
    assert crit_seq is not None
    await turns(session, 3, 13)
    history = await session.get_messages()
    await session.compact()
    [event] = await typed(session, "summary.recorded")
    assert event.payload.from_seq > crit_seq
    view = await session.view()
    # system, the 3 turns before the critical barrier, the critical message, summary, tail
    assert view == [*history[:8], {"role": "user", "content": SUMMARY_1}, *history[-10:]]
    prompt = fake_llm.calls("primary")[0].text
    assert "CRIT:" not in prompt and "You port databases." not in prompt


# ------------------------------------------------------------------ rolling + replay


async def test_second_compaction_rolls_the_prior_summary(ledger: Ledger, fake_llm: FakeLLM) -> None:
    fake_llm.script("primary", [ok(SUMMARY_1), ok(SUMMARY_2)])
    session = await new_session(ledger, fake_llm)
    await session.compact()
    [first] = await typed(session, "summary.recorded")
    view_after_first = await session.view()
    await turns(session, 10, 16)
    history = await session.get_messages()
    await session.compact()

    events = await typed(session, "summary.recorded")
    assert len(events) == 2
    second = events[1]
    assert second.payload.audit["prior_summary_seq"] == first.seq
    # the new range starts where the prior summary stands: it replaces it
    assert second.payload.from_seq == first.payload.from_seq
    assert second.payload.audit["covered"][0] == first.payload.audit["covered"][0]

    sent = fake_llm.calls("primary")
    assert len(sent) == 2
    prompt = sent[1].text
    assert "<prior_summary>" in prompt and "PRIOR SUMMARY" in prompt
    start, end = prompt.index("<prior_summary>"), prompt.index("</prior_summary>")
    assert "S1-MARK" in prompt[start:end]
    transcript = prompt[prompt.index("<transcript>") :]
    assert "S1-MARK" not in transcript  # labelled as prior, not replayed as a turn
    assert not any(f"U-{i:03d}" in prompt for i in range(5))  # already folded
    assert all(f"U-{i:03d}" in transcript for i in range(5, 11))

    view = await session.view()
    assert len(await summaries_in_view(session)) == 1
    assert view == [history[0], {"role": "user", "content": SUMMARY_2}, *history[-10:]]
    assert await session.get_messages() == history
    assert len(await typed(session, "message.appended")) == len(history)

    # replay: right after each summary, the view is that summary + its tail, nothing more
    assert await session.view_at(first.seq) == view_after_first
    assert await session.view_at(second.seq) == view
    assert await session.view_at(session.head) == view
    for seq in (first.seq, second.seq):
        replayed = text_of(await session.view_at(seq))
        assert "U-000" not in replayed and "A-004" not in replayed

    reopened = await ledger.session("s", create=False)
    assert await reopened.view() == view
    assert await reopened.get_messages() == history
    assert [i.kind for i in await reopened.view_items()].count("summary") == 1
    assert await reopened.get_token_count() == await session.get_token_count()


async def test_rollback_to_pre_compact_checkpoint_restores_the_view(
    ledger: Ledger, fake_llm: FakeLLM
) -> None:
    fake_llm.script("primary", [ok(SUMMARY_1), ok(SUMMARY_2)])
    session = await new_session(ledger, fake_llm)
    before_first = await session.view_items()
    await session.compact()
    await turns(session, 10, 16)
    before_second = await session.view_items()
    await session.compact()
    checkpoints = [c for c in await session.checkpoints() if c.label == PRE_COMPACT_LABEL]
    assert len(checkpoints) == 2

    await session.rollback(PRE_COMPACT_LABEL)  # the latest: undoes the second summary
    assert await session.view_items() == before_second
    assert await session.get_token_count() == sum(i.tokens for i in before_second)
    assert len(await summaries_in_view(session)) == 1

    await session.rollback(checkpoints[0])  # before any summary
    assert await session.view_items() == before_first
    assert await session.view() == await session.get_messages()
    assert await session.get_token_count() == sum(i.tokens for i in before_first)
    assert await session.view_at(session.head) == [dict(i.message) for i in before_first]
    reopened = await ledger.session("s", create=False)
    assert await reopened.view_items() == before_first
    assert len(await typed(session, "summary.recorded")) == 2  # the ledger forgets nothing


# ------------------------------------------------------------------ failure paths


async def test_slow_model_times_out_and_the_next_one_answers(
    ledger: Ledger, fake_llm: FakeLLM, fallbacks: list[tuple[str, str, str]]
) -> None:
    fake_llm.handler("primary", slow(5.0))
    fake_llm.script("secondary", [ok(SUMMARY_1)])
    session = await new_session(ledger, fake_llm)
    session.on_fallback = lambda src, dst, exc: fallbacks.append((src, dst, type(exc).__name__))
    await session.compact()
    [event] = await typed(session, "summary.recorded")
    audit = event.payload.audit
    assert audit["model"] == "openai/secondary"
    assert [(a["model"], a["ok"]) for a in audit["attempts"]] == [
        ("openai/primary", False),
        ("openai/secondary", True),
    ]
    assert "timeout" in audit["attempts"][0]["error_type"].lower()
    assert [(s, d) for s, d, _ in fallbacks] == [("openai/primary", "openai/secondary")]
    assert event.payload.message["content"] == SUMMARY_1


async def test_server_error_is_retried_on_the_same_model(ledger: Ledger, fake_llm: FakeLLM) -> None:
    fake_llm.script("primary", [server_error(), ok(SUMMARY_1)])
    session = await new_session(ledger, fake_llm, num_retries=1)
    await session.compact()
    [event] = await typed(session, "summary.recorded")
    audit = event.payload.audit
    assert audit["model"] == "openai/primary"
    assert [(a["model"], a["ok"]) for a in audit["attempts"]] == [
        ("openai/primary", False),
        ("openai/primary", True),
    ]
    assert fake_llm.models_called() == ["primary", "primary"]


@pytest.mark.parametrize(
    ("reply", "code"),
    [
        (empty(""), "INVALID_SUMMARY"),
        (empty("   \n"), "INVALID_SUMMARY"),
        (long_answer(2.0), "CONTEXT_GROWTH"),
    ],
)
async def test_invalid_answer_moves_to_the_next_model(
    ledger: Ledger, fake_llm: FakeLLM, reply: Any, code: str
) -> None:
    fake_llm.handler("primary", reply)
    fake_llm.script("secondary", [ok(SUMMARY_1)])
    session = await new_session(ledger, fake_llm, num_retries=2)
    await session.compact()
    [event] = await typed(session, "summary.recorded")
    audit = event.payload.audit
    assert audit["model"] == "openai/secondary"
    assert [(a["model"], a["error_type"]) for a in audit["attempts"]] == [
        ("openai/primary", code),
        ("openai/secondary", None),
    ]
    assert fake_llm.models_called() == ["primary", "secondary"]  # no retry of a bad answer


async def test_context_window_exceeded_is_not_retried(ledger: Ledger, fake_llm: FakeLLM) -> None:
    fake_llm.handler("primary", context_exceeded())
    fake_llm.script("secondary", [ok(SUMMARY_1)])
    session = await new_session(ledger, fake_llm, num_retries=2)
    await session.compact()
    [event] = await typed(session, "summary.recorded")
    assert event.payload.audit["model"] == "openai/secondary"
    assert event.payload.audit["attempts"][0]["error_type"] == "ContextWindowExceededError"
    assert fake_llm.models_called() == ["primary", "secondary"]


async def test_every_model_failing_falls_back_to_truncate(
    ledger: Ledger, fake_llm: FakeLLM, fallbacks: list[tuple[str, str, str]]
) -> None:
    fake_llm.handler("primary", server_error())
    fake_llm.handler("secondary", empty())
    session = await new_session(ledger, fake_llm, n_turns=20, offline_fallback=False)
    session.on_fallback = lambda src, dst, exc: fallbacks.append((src, dst, type(exc).__name__))
    history = await session.get_messages()
    head = session.head
    budget = 600
    assert await session.get_token_count() > budget

    saved = await session.compact(token_budget=budget)

    assert saved > 0
    assert await typed(session, "summary.recorded") == []
    events: list[Any] = [e async for e in session.events(head + 1)]
    assert [e.type for e in events] == ["checkpoint.created", "compaction.applied"]
    assert events[0].payload.label == PRE_COMPACT_LABEL
    assert events[1].payload.strategy == "truncate"
    assert fake_llm.models_called() == ["primary", "secondary"]
    assert [(s, d) for s, d, _ in fallbacks] == [("openai/primary", "openai/secondary")]
    assert await session.get_messages() == history
    assert await summaries_in_view(session) == []
    sent = await session.get_messages_for_request(token_budget=budget)
    assert tokens(session, sent) <= budget
    assert sent[0] == history[0]  # the system message survives truncation
    assert sent[-1] == history[-1]


async def test_every_model_failing_uses_the_offline_summarizer_by_default(
    ledger: Ledger, fake_llm: FakeLLM, fallbacks: list[tuple[str, str, str]]
) -> None:
    fake_llm.handler("primary", server_error())
    fake_llm.handler("secondary", context_exceeded())
    session = await new_session(ledger, fake_llm)
    assert session.config.summarizer.offline_fallback is True
    session.on_fallback = lambda src, dst, exc: fallbacks.append((src, dst, type(exc).__name__))
    history = await session.get_messages()
    await session.compact()
    [event] = await typed(session, "summary.recorded")
    audit = event.payload.audit
    assert audit["model"] == OFFLINE_MODEL
    assert audit["prompt_version"] == OFFLINE_VERSION
    assert [(a["model"], a["ok"]) for a in audit["attempts"]] == [
        ("openai/primary", False),
        ("openai/secondary", False),
        (OFFLINE_MODEL, True),
    ]
    assert [(s, d) for s, d, _ in fallbacks] == [
        ("openai/primary", "openai/secondary"),
        ("openai/secondary", OFFLINE_MODEL),
    ]
    text = event.payload.message["content"]
    assert "U-000" in text  # the first request is kept verbatim
    assert await session.view() == [history[0], event.payload.message, *history[-10:]]


# ------------------------------------------------------------------ hooks


async def test_overflow_fires_before_and_summarization_after(
    ledger: Ledger, fake_llm: FakeLLM
) -> None:
    fake_llm.script("primary", [ok(SUMMARY_1)])
    session = await new_session(ledger, fake_llm)
    seen: list[tuple[str, dict[str, Any], int]] = []

    def record(name: str, data: dict[str, Any]) -> None:
        seen.append((name, data, len(fake_llm.requests)))

    session.hooks.on("*", record)
    items = await session.view_items()
    await session.compact()
    names = [n for n, _, _ in seen]
    assert "context:overflow" in names and "context:summarization" in names
    overflow = names.index("context:overflow")
    summarization = names.index("context:summarization")
    assert overflow < summarization
    assert seen[overflow][2] == 0  # before the model was asked
    assert seen[summarization][2] == 1
    data = seen[summarization][1]
    assert data["summary_length"] == len(SUMMARY_1)
    assert data["preserved_messages"] == len(items) - 10  # system + the 5-turn tail
    assert data["model"] == "openai/primary"
    assert names.index("context:pre_compact") < overflow
    assert names.index("context:post_compact") > summarization


async def test_pre_compact_cancel_writes_nothing(ledger: Ledger, fake_llm: FakeLLM) -> None:
    session = await new_session(ledger, fake_llm)
    asked: list[CompactContext] = []

    def cancel(ctx: CompactContext) -> CompactDecision:
        asked.append(ctx)
        return CompactDecision(cancel=True)

    session.pre_compact = cancel
    head, view = session.head, await session.view()
    assert await session.compact() == 0
    assert session.head == head
    assert [e async for e in session.events(head + 1)] == []
    assert await session.view() == view
    assert fake_llm.requests == []
    assert len(asked) == 1 and asked[0].trigger == "manual"
    assert asked[0].message_count == len(view)
    assert asked[0].current_tokens == await session.get_token_count()


async def test_pre_compact_custom_instructions_reach_prompt_and_audit(
    ledger: Ledger, fake_llm: FakeLLM
) -> None:
    fake_llm.script("primary", [ok(SUMMARY_1)])
    session = await new_session(ledger, fake_llm)

    async def steer(ctx: CompactContext) -> CompactDecision:
        return CompactDecision(custom_instructions="Keep every migration id (MIG-77).")

    session.pre_compact = steer
    await session.compact()
    prompt = fake_llm.calls("primary")[0].text
    assert "<additional_instructions>\nKeep every migration id (MIG-77)." in prompt
    [event] = await typed(session, "summary.recorded")
    assert event.payload.audit["custom_instructions"] == "Keep every migration id (MIG-77)."


async def test_pre_compact_custom_summary_skips_the_models(
    ledger: Ledger, fake_llm: FakeLLM
) -> None:
    session = await new_session(ledger, fake_llm)
    session.pre_compact = lambda ctx: CompactDecision(custom_summary="## Task overview\n- HOOK")
    history = await session.get_messages()
    await session.compact()
    assert fake_llm.requests == []
    [event] = await typed(session, "summary.recorded")
    assert event.payload.message == {"role": "user", "content": "## Task overview\n- HOOK"}
    assert event.payload.audit["model"] == "pre_compact hook"
    assert event.payload.audit["attempts"] == []
    assert await session.view() == [history[0], event.payload.message, *history[-10:]]


# ------------------------------------------------------------------ request views


async def test_summarize_summarizes_in_the_background_without_auto_compact(
    ledger: Ledger, fake_llm: FakeLLM
) -> None:
    fake_llm.script("primary", [ok(SUMMARY_1)])
    session = await new_session(ledger, fake_llm, n_turns=40)
    assert session.config.auto_compact is False
    budget = 400
    assert await session.get_token_count() > 5 * budget
    # the request is served at once, fitted as truncate would
    sent = await session.get_messages_for_request(token_budget=budget)
    assert tokens(session, sent) <= budget
    assert sent[0]["role"] == "system" and sent[-1] == assistant(39)
    assert await session.request_at(session.request_seq, token_budget=budget) == sent
    await session.close()  # waits for the summary in flight
    [event] = await typed(session, "summary.recorded")
    assert event.payload.audit["trigger"] == "background"
    assert len(fake_llm.requests) == 1
    # later requests use it
    await turns(session, 100, 101)
    again = await session.get_messages_for_request(token_budget=budget)
    assert SUMMARY_1 in text_of(again) and tokens(session, again) <= budget
    assert again[-2:] == [user(100), assistant(100)]
    assert await session.request_at(session.request_seq, token_budget=budget) == again


async def test_a_failing_summarizer_never_blocks_or_loses_a_turn(
    ledger: Ledger, fake_llm: FakeLLM
) -> None:
    fake_llm.handler("primary", server_error())
    fake_llm.handler("secondary", server_error())
    session = await new_session(ledger, fake_llm, n_turns=40, offline_fallback=False)
    budget = 400
    for i in range(100, 110):
        await turns(session, i, i + 1)
        sent = await session.get_messages_for_request(token_budget=budget)
        assert tokens(session, sent) <= budget
        assert sent[-2:] == [user(i), assistant(i)]
        assert await session.request_at(session.request_seq, token_budget=budget) == sent
        await session.close()
    assert fake_llm.requests  # it was tried
    assert await typed(session, "summary.recorded") == []
    failure = session.summary_failure
    assert isinstance(failure, CompactionError) and failure.code == "ALL_MODELS_FAILED"


async def test_auto_compact_summarizes_once_over_the_threshold(
    ledger: Ledger, fake_llm: FakeLLM
) -> None:
    session = await ledger.session("s", config={**config(fake_llm), "auto_compact": True})
    await session.add_message({"role": "system", "content": "You port databases."})
    budget = 1500
    for i in range(30):
        await turns(session, i, i + 1)
        sent = await session.get_messages_for_request(token_budget=budget)
        assert tokens(session, sent) <= budget
        await session.close()
        if fake_llm.requests:
            break
    events = await typed(session, "summary.recorded")
    assert len(events) == 1 and len(fake_llm.requests) == 1
    assert events[0].payload.audit["trigger"] == "background"
    # the next request is served from the recorded summary: no second call
    await turns(session, 100, 101)
    again = await session.get_messages_for_request(token_budget=budget)
    await session.close()
    assert len(fake_llm.requests) == 1
    assert events[0].payload.message["content"] in text_of(again)
    assert again[-2:] == [user(100), assistant(100)]
    assert await session.request_at(session.request_seq, token_budget=budget) == again


async def test_deepseek_target_gets_reasoning_on_an_assistant_summary(
    ledger: Ledger, fake_llm: FakeLLM
) -> None:
    fake_llm.script("primary", [ok(SUMMARY_1)])
    session = await new_session(ledger, fake_llm, summary_role="assistant")
    await session.compact()
    stored = {"role": "assistant", "content": SUMMARY_1}

    deep = await session.get_messages_for_request(
        token_budget=50_000, provider=Provider("deepseek-reasoner")
    )
    [summary] = [m for m in deep if m.get("content") == SUMMARY_1]
    assert summary["role"] == "assistant" and summary.get("reasoning_content")

    plain = await session.get_messages_for_request(token_budget=50_000, provider=Provider("gpt-4o"))
    [summary] = [m for m in plain if m.get("content") == SUMMARY_1]
    assert "reasoning_content" not in summary

    [event] = await typed(session, "summary.recorded")
    assert event.payload.message == stored
    assert stored in await session.view()
    assert all("reasoning_content" not in m for m in await session.view())

    # the session's own model counts as the target when no provider is given
    by_model = await ledger.session("s", model="deepseek-reasoner")
    via_session = await by_model.get_messages_for_request(token_budget=50_000)
    [summary] = [m for m in via_session if m.get("content") == SUMMARY_1]
    assert summary.get("reasoning_content")
    assert all("reasoning_content" not in m for m in await by_model.view())


async def test_signed_thinking_is_stripped_for_other_providers_only(
    ledger: Ledger, fake_llm: FakeLLM
) -> None:
    fake_llm.script("primary", [ok(SUMMARY_1)])
    session = await new_session(ledger, fake_llm)
    thinking = {"type": "thinking", "thinking": "private chain", "signature": "c2lnbmVk"}
    redacted = {"type": "redacted_thinking", "data": "ZW5jcnlwdGVk"}
    signed = {
        "role": "assistant",
        "content": [thinking, {"type": "text", "text": "T-SIGNED the schema is ready."}],
    }
    only_thinking = {"role": "assistant", "content": [redacted]}
    await session.add_message({"role": "user", "content": "U-900 is the schema ready?"})
    await session.add_message(signed)
    await session.add_message({"role": "user", "content": "U-901 and the indexes?"})
    await session.add_message(only_thinking)
    await session.add_message({"role": "user", "content": "U-902 thanks"})
    await session.compact()
    assert len(await summaries_in_view(session)) == 1

    other = await session.get_messages_for_request(token_budget=50_000, provider=Provider("gpt-4o"))
    flat = repr(other)
    assert "T-SIGNED" in flat
    assert "private chain" not in flat and "c2lnbmVk" not in flat and "ZW5jcnlwdGVk" not in flat

    claude = await session.get_messages_for_request(
        token_budget=50_000, provider=Provider("claude-sonnet-4-5")
    )
    assert signed in claude and only_thinking in claude

    assert signed in await session.get_messages() and only_thinking in await session.view()
    stored = [e.payload.message for e in await typed(session, "message.appended")]
    assert signed in stored and only_thinking in stored


async def test_request_view_with_a_summary_bridge_fits_the_budget(
    ledger: Ledger, fake_llm: FakeLLM
) -> None:
    """The bridge turn put between a user summary and the user turn after it is sent
    too: it has to fit the budget like every other message."""
    fake_llm.script("primary", [ok(SUMMARY_1)])
    session = await ledger.session("s", config={**config(fake_llm), "compact_threshold": 1.0})
    await turns(session, 0, 10)
    await session.compact()
    budget = await session.get_token_count()  # the view exactly fills the budget
    sent = await session.get_messages_for_request(token_budget=budget)
    assert {"role": "user", "content": SUMMARY_1} in sent
    assert tokens(session, sent) <= budget


async def test_offline_summary_keeps_a_stated_name(ledger: Ledger, fake_llm: FakeLLM) -> None:
    """The offline summarizer keeps user statements carrying names verbatim: a name
    with no digit in a possessive sentence ("My manager's name is ...") included."""
    session = await ledger.session(
        "s",
        config={
            "compaction_strategy": "summarize",
            "token_counter": "chars",
            "summarizer": {"models": [], "preserve_recent_turns": 1, "min_messages": 2},
        },
    )
    for text in (
        "Let's tune the replica lag alerts.",
        "My manager's name is Ana Brandt; copy them on incidents.",
        "Our on-call lead is Kwame Okafor.",
        "Then look at the vacuum settings.",
        "Thanks, that is all for now.",
    ):
        await session.add_message({"role": "user", "content": text})
        await session.add_message({"role": "assistant", "content": "Done, all good."})
    await session.compact()
    [event] = await typed(session, "summary.recorded")
    assert event.payload.audit["model"] == OFFLINE_MODEL
    summary = event.payload.message["content"]
    assert "Kwame Okafor" in summary
    assert "Ana Brandt" in summary


async def test_summary_after_set_messages_keeps_the_preserved_tail(ledger: Ledger) -> None:
    """All messages of one messages.replaced event share a seq: the range needs parts."""
    session = await ledger.session(
        "restored", config={"summarizer": {"preserve_recent_turns": 2, "min_messages": 3}}
    )
    restored = [{"role": "system", "content": "rules"}]
    for i in range(8):
        restored += [
            {"role": "user", "content": f"q{i} " + "x " * 40},
            {"role": "assistant", "content": f"a{i} " + "y " * 40},
        ]
    await session.set_messages(restored)
    saved = await session.compact("summarize")
    view = await session.view()
    assert view[0] == {"role": "system", "content": "rules"}
    assert view[-4:] == restored[-4:]  # the two preserved turns
    assert len(view) == 1 + 1 + 4
    assert saved > 0
    assert all(r.ok for r in await ledger.rebuild("restored"))
    assert await session.view_at(session.head) == view
