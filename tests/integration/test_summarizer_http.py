"""summarize() end to end: litellm over real HTTP to the scripted fake server.

Nothing here mocks litellm or our code; the fake server is the only stand-in.
The pure parts (prompt, validation, offline summary, reasoning helpers) are
tested at the bottom without a server.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from contextledger.core.summary.offline import OFFLINE_MODEL, OFFLINE_VERSION
from contextledger.core.summary.prompt import (
    PROMPT_VERSION,
    SummaryRequest,
)
from contextledger.core.tokens import CharsCounter
from contextledger.errors import CompactionError
from contextledger.summarizer import Attempt, Backoff, ModelSpec, summarize
from tests.fakellm import (
    FakeLLM,
    context_exceeded,
    empty,
    long_answer,
    ok,
    rate_limited,
    running_fake_llm,
    server_error,
    slow,
)
from tests.samples import MESSAGES

COUNTER = CharsCounter()
FAST = Backoff(base_s=0.01, factor=2.0, max_s=0.05, jitter=0.0, retry_after_cap_s=5.0)
SUMMARY = "## Task overview\n- Port the ledger to PostgreSQL 18.\n## Durable facts\n- port 8443"

TOKENS_BEFORE = COUNTER.count_messages(MESSAGES)


@pytest.fixture(name="fake_llm")
def _fake_llm() -> Iterator[FakeLLM]:
    """Local copy of ``tests.fakellm.fake_llm`` so this file runs without the conftest import."""
    with running_fake_llm() as fake:
        yield fake


def spec(fake: FakeLLM, name: str, *, timeout: float = 5.0, num_retries: int = 1) -> ModelSpec:
    return ModelSpec(
        f"openai/{name}",
        api_base=fake.base_url,
        api_key="test",
        timeout=timeout,
        num_retries=num_retries,
    )


def request(**kw: Any) -> SummaryRequest:
    return SummaryRequest(messages=MESSAGES, **kw)


def kinds(attempts: tuple[Attempt, ...] | list[Attempt]) -> list[tuple[str, str | None]]:
    return [(a.model, a.error_type) for a in attempts]


# ============================================================ the chain over HTTP


async def test_good_answer_first_model(fake_llm: FakeLLM) -> None:
    fake_llm.script("primary", [ok(SUMMARY)])
    res = await summarize(
        request(custom_instructions="Focus on the database move", max_summary_tokens=300),
        [spec(fake_llm, "primary"), spec(fake_llm, "secondary")],
        counter=COUNTER,
        tokens_before=TOKENS_BEFORE,
    )
    assert res.model == "openai/primary"
    assert res.text == SUMMARY
    assert kinds(res.attempts) == [("openai/primary", None)] and res.attempts[0].ok
    assert res.tokens_before == TOKENS_BEFORE
    assert res.tokens_after == COUNTER.count_text(SUMMARY) < TOKENS_BEFORE
    assert res.prompt_version == PROMPT_VERSION
    assert res.custom_instructions == "Focus on the database move"
    assert res.usage is not None and res.usage["prompt_tokens"] == 10
    assert fake_llm.models_called() == ["primary"]
    sent = fake_llm.calls("primary")[0]
    assert sent.max_tokens == 300
    assert sent.headers["authorization"] == "Bearer test"
    assert "Focus on the database move" in sent.text
    assert "secret chain of thought" not in sent.text  # thinking never leaves the view


async def test_slow_model_times_out_then_next_model_answers(fake_llm: FakeLLM) -> None:
    fake_llm.handler("slowpoke", slow(5.0))
    fake_llm.script("secondary", [ok(SUMMARY)])
    seen: list[tuple[str, str, str]] = []
    res = await summarize(
        request(),
        [spec(fake_llm, "slowpoke", timeout=0.5, num_retries=0), spec(fake_llm, "secondary")],
        counter=COUNTER,
        tokens_before=TOKENS_BEFORE,
        backoff=FAST,
        on_fallback=lambda src, dst, err: seen.append((src, dst, type(err).__name__)),
    )
    assert res.model == "openai/secondary"
    assert kinds(res.attempts) == [("openai/slowpoke", "Timeout"), ("openai/secondary", None)]
    assert "timed out" in (res.attempts[0].error or "").lower()
    assert seen == [("openai/slowpoke", "openai/secondary", "Timeout")]


async def test_server_error_is_retried_then_falls_back(fake_llm: FakeLLM) -> None:
    fake_llm.handler("flaky", server_error())
    fake_llm.script("secondary", [ok(SUMMARY)])
    res = await summarize(
        request(),
        [spec(fake_llm, "flaky", num_retries=1), spec(fake_llm, "secondary")],
        counter=COUNTER,
        tokens_before=TOKENS_BEFORE,
        backoff=FAST,
    )
    assert fake_llm.models_called() == ["flaky", "flaky", "secondary"]  # no hidden SDK retries
    assert kinds(res.attempts) == [
        ("openai/flaky", "InternalServerError"),
        ("openai/flaky", "InternalServerError"),
        ("openai/secondary", None),
    ]
    assert res.attempts[0].backoff_s is not None  # waited before the retry
    assert res.attempts[1].backoff_s is None  # ...but not before switching model


async def test_server_error_then_success_on_retry(fake_llm: FakeLLM) -> None:
    fake_llm.script("flaky", [server_error(), ok(SUMMARY)])
    res = await summarize(
        request(),
        [spec(fake_llm, "flaky", num_retries=2)],
        counter=COUNTER,
        tokens_before=TOKENS_BEFORE,
        backoff=FAST,
    )
    assert res.model == "openai/flaky"
    assert [a.ok for a in res.attempts] == [False, True]


async def test_rate_limit_retry_after_is_honoured(fake_llm: FakeLLM) -> None:
    fake_llm.script("limited", [rate_limited(1), ok(SUMMARY)])
    res = await summarize(
        request(),
        [spec(fake_llm, "limited", num_retries=1)],
        counter=COUNTER,
        tokens_before=TOKENS_BEFORE,
        backoff=FAST,
    )
    assert fake_llm.models_called() == ["limited", "limited"]
    first = res.attempts[0]
    assert (first.error_type, first.retry_after_s) == ("RateLimitError", 1.0)
    assert first.backoff_s == 1.0  # Retry-After beat the 0.01 s progressive delay
    assert res.attempts[1].ok


async def test_rate_limit_retry_after_is_capped(fake_llm: FakeLLM) -> None:
    fake_llm.script("limited", [rate_limited(3600), ok(SUMMARY)])
    capped = Backoff(base_s=0.01, jitter=0.0, retry_after_cap_s=0.05)
    res = await summarize(
        request(),
        [spec(fake_llm, "limited")],
        counter=COUNTER,
        tokens_before=TOKENS_BEFORE,
        backoff=capped,
    )
    assert res.attempts[0].retry_after_s == 3600.0
    assert res.attempts[0].backoff_s == 0.05


async def test_empty_answer_is_invalid_and_moves_on(fake_llm: FakeLLM) -> None:
    fake_llm.handler("blank", empty("  \n "))
    fake_llm.script("secondary", [ok(SUMMARY)])
    res = await summarize(
        request(),
        [spec(fake_llm, "blank", num_retries=3), spec(fake_llm, "secondary")],
        counter=COUNTER,
        tokens_before=TOKENS_BEFORE,
        backoff=FAST,
    )
    assert kinds(res.attempts) == [("openai/blank", "INVALID_SUMMARY"), ("openai/secondary", None)]
    assert fake_llm.models_called() == ["blank", "secondary"]  # invalid: not retried


@pytest.mark.parametrize(
    "text",
    [
        "Error: upstream model unavailable",
        "I'm sorry, but I can't help with that request.",
        "As an AI language model, I cannot summarize this.",
        "<!DOCTYPE html><html><body>502 Bad Gateway</body></html>",
        '{"error": {"message": "quota exceeded"}}',
    ],
)
async def test_error_returned_as_text_is_invalid(fake_llm: FakeLLM, text: str) -> None:
    fake_llm.script("liar", [ok(text)])
    with pytest.raises(CompactionError) as info:
        await summarize(
            request(),
            [spec(fake_llm, "liar")],
            counter=COUNTER,
            tokens_before=TOKENS_BEFORE,
            backoff=FAST,
        )
    assert info.value.code == "ALL_MODELS_FAILED"
    assert kinds(info.value.details["attempts"]) == [("openai/liar", "INVALID_SUMMARY")]


async def test_truncated_answer_is_invalid(fake_llm: FakeLLM) -> None:
    fake_llm.script("cut", [ok("## Task overview\n- half a", finish_reason="length")])
    fake_llm.script("secondary", [ok(SUMMARY)])
    res = await summarize(
        request(),
        [spec(fake_llm, "cut"), spec(fake_llm, "secondary")],
        counter=COUNTER,
        tokens_before=TOKENS_BEFORE,
        backoff=FAST,
    )
    assert res.attempts[0].error_type == "INVALID_SUMMARY"
    assert "cut off" in (res.attempts[0].error or "")
    assert res.model == "openai/secondary"


async def test_answer_longer_than_input_is_context_growth(fake_llm: FakeLLM) -> None:
    fake_llm.handler("verbose", long_answer(2.0))
    with pytest.raises(CompactionError) as info:
        await summarize(
            request(),
            [spec(fake_llm, "verbose")],
            counter=COUNTER,
            tokens_before=TOKENS_BEFORE,
            backoff=FAST,
        )
    last = info.value.details["attempts"][-1]
    assert last.error_type == "CONTEXT_GROWTH"
    assert "% larger" in last.error
    assert fake_llm.models_called() == ["verbose"]


async def test_context_growth_moves_to_next_model(fake_llm: FakeLLM) -> None:
    fake_llm.handler("verbose", long_answer(1.5))
    fake_llm.script("terse", [ok(SUMMARY)])
    res = await summarize(
        request(),
        [spec(fake_llm, "verbose"), spec(fake_llm, "terse")],
        counter=COUNTER,
        tokens_before=TOKENS_BEFORE,
        backoff=FAST,
    )
    assert kinds(res.attempts) == [("openai/verbose", "CONTEXT_GROWTH"), ("openai/terse", None)]


async def test_context_window_exceeded_is_not_retried(fake_llm: FakeLLM) -> None:
    fake_llm.handler("small", context_exceeded())
    fake_llm.script("big", [ok(SUMMARY)])
    res = await summarize(
        request(),
        [spec(fake_llm, "small", num_retries=3), spec(fake_llm, "big")],
        counter=COUNTER,
        tokens_before=TOKENS_BEFORE,
        backoff=FAST,
    )
    assert fake_llm.models_called() == ["small", "big"]
    assert kinds(res.attempts) == [
        ("openai/small", "ContextWindowExceededError"),
        ("openai/big", None),
    ]


async def test_all_models_fail(fake_llm: FakeLLM) -> None:
    fake_llm.handler("a", server_error())
    fake_llm.handler("b", context_exceeded())
    fallbacks: list[tuple[str, str]] = []

    async def on_fallback(src: str, dst: str, err: BaseException) -> None:
        fallbacks.append((src, dst))

    with pytest.raises(CompactionError) as info:
        await summarize(
            request(),
            [spec(fake_llm, "a", num_retries=1), spec(fake_llm, "b")],
            counter=COUNTER,
            tokens_before=TOKENS_BEFORE,
            backoff=FAST,
            on_fallback=on_fallback,
        )
    err = info.value
    assert err.code == "ALL_MODELS_FAILED" and err.is_retryable
    assert kinds(err.details["attempts"]) == [
        ("openai/a", "InternalServerError"),
        ("openai/a", "InternalServerError"),
        ("openai/b", "ContextWindowExceededError"),
    ]
    assert err.model == "openai/b"
    assert fallbacks == [("openai/a", "openai/b")]


async def test_all_fail_with_offline_fallback(fake_llm: FakeLLM) -> None:
    fake_llm.handler("a", server_error())
    fallbacks: list[tuple[str, str]] = []

    def boom(src: str, dst: str, err: BaseException) -> None:
        fallbacks.append((src, dst))
        raise RuntimeError("a broken callback must not break summarization")

    res = await summarize(
        request(prior_summary="## Durable facts\n- Deploy key id: DK-4471"),
        [spec(fake_llm, "a", num_retries=0)],
        counter=COUNTER,
        tokens_before=TOKENS_BEFORE + 20,
        backoff=FAST,
        offline_fallback=True,
        on_fallback=boom,
    )
    assert res.model == OFFLINE_MODEL
    assert res.prompt_version == OFFLINE_VERSION
    assert kinds(res.attempts) == [("openai/a", "InternalServerError"), (OFFLINE_MODEL, None)]
    assert fallbacks == [("openai/a", OFFLINE_MODEL)]
    assert "- Deploy key id: DK-4471" in res.text
    assert "My name is Ada." in res.text
    assert res.tokens_after < res.tokens_before


async def test_default_handler_rolls_a_summary_forward(fake_llm: FakeLLM) -> None:
    """Several rolling passes against the deterministic default answer."""
    prior: str | None = None
    for turn in range(3):
        msgs = [{"role": "user", "content": f"step {turn}: " + "details " * 60}]
        res = await summarize(
            SummaryRequest(messages=msgs, prior_summary=prior),
            [spec(fake_llm, "default")],
            counter=COUNTER,
            tokens_before=COUNTER.count_messages(msgs) + 200,
            backoff=FAST,
        )
        assert res.model == "openai/default"
        prior = res.text
    assert len(fake_llm.calls("default")) == 3
    last_prompt = fake_llm.calls("default")[-1].text
    assert "PRIOR SUMMARY" in last_prompt and prior is not None


async def test_prompt_on_the_wire_labels_prior_summary(fake_llm: FakeLLM) -> None:
    fake_llm.script("primary", [ok(SUMMARY)])
    await summarize(
        request(
            prior_summary="- The user's cat is called Turing",
            custom_instructions="Keep SQL snippets",
        ),
        [spec(fake_llm, "primary")],
        counter=COUNTER,
        tokens_before=TOKENS_BEFORE + 50,
    )
    sent = fake_llm.calls("primary")[0]
    assert [m["role"] for m in sent.messages] == ["system", "user"]
    user = sent.messages[1]["content"]
    assert (
        user.index("PRIOR SUMMARY")
        < user.index("The user's cat is called Turing")
        < user.index("<transcript>")
    )
    assert "Keep SQL snippets" in user


async def test_invalid_arguments() -> None:
    with pytest.raises(Exception, match="tokens_before"):
        await summarize(request(), [ModelSpec("openai/x")], counter=COUNTER, tokens_before=0)
    with pytest.raises(Exception, match="no models"):
        await summarize(request(), [], counter=COUNTER, tokens_before=10)
    with pytest.raises(Exception, match="num_retries"):
        ModelSpec("openai/x", num_retries=-1)
    assert "sk-hidden" not in repr(ModelSpec("openai/x", api_key="sk-hidden"))


# ============================================================ prompt (pure)


# ============================================================ validation (pure)


# ============================================================ offline summary (pure)


# ============================================================ reasoning helpers (pure)
