"""OpenTelemetry spans, against the real SDK (in-memory exporter) and real stores."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from contextledger import ConcurrencyError, Ledger, telemetry
from contextledger.http.settings import Settings
from tests.fakellm import FakeLLM
from tests.integration.service_support import running_service

# _warm_litellm (autouse): litellm's first use takes longer than the test models' timeout
from tests.integration.test_compactor import _warm_litellm, new_session  # noqa: F401
from tests.integration.test_recall import FACT, QUESTION, chatter

EXPORTER = InMemorySpanExporter()
CANARY = "canary-7d1f: the vault code is 4471"


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """A tracer provider for the test and its spans. The API sets one provider a process;
    it is taken back after the test (as OpenTelemetry's own test utilities do), or every
    later test on this worker ran traced: the append lane, for one, steps aside then."""
    from opentelemetry.util._once import Once

    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(EXPORTER))
    trace.set_tracer_provider(provider)
    EXPORTER.clear()
    try:
        yield EXPORTER
    finally:
        EXPORTER.clear()
        trace._TRACER_PROVIDER_SET_ONCE = Once()  # type: ignore[attr-defined]
        trace._TRACER_PROVIDER = None  # type: ignore[attr-defined]
        telemetry._tracer = None
        assert not telemetry.active()


def values(span: ReadableSpan) -> str:
    return repr(dict(span.attributes or {})) + repr(span.events) + repr(span.status)


def test_without_a_tracer_provider_no_span_is_made() -> None:
    """A fresh process with the API installed but no provider: ``span`` yields None."""
    code = (
        "from contextledger import telemetry\n"
        "assert telemetry.tracer() is None and not telemetry.active()\n"
        "with telemetry.span('create_memory', {'a': 1}) as s:\n"
        "    assert s is None\n"
        "import opentelemetry.trace as t\n"
        "assert isinstance(t.get_tracer_provider(), t.ProxyTracerProvider)\n"
        "print('none')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "none"


async def test_a_turn_is_three_spans_without_content(
    ledger: Ledger, spans: InMemorySpanExporter
) -> None:
    session = await ledger.session("traced", config={"token_counter": "chars"})
    await session.add_message({"role": "user", "content": FACT + " " + CANARY})
    await chatter(session, 30)
    spans.clear()
    seq = await session.add_message({"role": "user", "content": QUESTION})  # a turn:
    request = await session.get_messages_for_request(token_budget=2000)
    answer = await session.add_message({"role": "assistant", "content": "Port 18443."})
    assert "18443" in str(request)  # recall brought the fact back
    finished = spans.get_finished_spans()
    assert [s.name for s in finished] == ["create_memory", "search_memory", "create_memory"]
    first, search, last = finished
    for s in finished:
        assert s.kind == SpanKind.INTERNAL
        assert s.attributes is not None and s.attributes["gen_ai.conversation.id"] == "traced"
        assert CANARY not in values(s) and "18443" not in values(s)
    assert first.attributes is not None and last.attributes is not None
    assert first.attributes["gen_ai.operation.name"] == "create_memory"
    assert first.attributes["gen_ai.memory.record.id"] == str(seq)
    assert first.attributes["gen_ai.memory.record.count"] == 1
    assert last.attributes["contextledger.seq"] == answer
    assert search.attributes is not None
    assert search.attributes["gen_ai.operation.name"] == "search_memory"
    assert search.attributes["contextledger.seq"] == seq
    assert search.attributes["gen_ai.memory.record.count"] >= 1
    assert "gen_ai.memory.query.text" not in search.attributes


async def test_content_only_when_the_application_opts_in(
    ledger: Ledger, spans: InMemorySpanExporter, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(telemetry.CAPTURE_CONTENT_ENV, "true")
    session = await ledger.session("opted", config={"token_counter": "chars"})
    await session.add_message({"role": "user", "content": FACT})
    await chatter(session, 30)
    await session.add_message({"role": "user", "content": QUESTION})
    await session.get_messages_for_request(token_budget=2000)
    by_name = {s.name: s for s in spans.get_finished_spans()}
    search = by_name["search_memory"].attributes or {}
    assert search["gen_ai.memory.query.text"] == QUESTION
    assert QUESTION in str((by_name["create_memory"].attributes or {})["gen_ai.memory.records"])


async def test_an_error_is_its_code_never_its_text(
    ledger: Ledger, spans: InMemorySpanExporter
) -> None:
    session = await ledger.session("conflict")
    await session.add_message({"role": "user", "content": "one"})
    with pytest.raises(ConcurrencyError):
        await session.add_message({"role": "user", "content": CANARY}, expected_seq=1)
    failed = spans.get_finished_spans()[-1]
    assert failed.name == "create_memory" and failed.status.status_code == StatusCode.ERROR
    assert (failed.attributes or {})["error.type"] == "CONCURRENCY_CONFLICT"
    assert not failed.events and CANARY not in values(failed)


async def test_compaction_and_the_summarizer_call(
    ledger: Ledger, fake: FakeLLM, spans: InMemorySpanExporter
) -> None:
    session = await new_session(ledger, fake, "primary", n_turns=12)
    spans.clear()
    saved = await session.compact(token_budget=1500)
    assert saved > 0
    finished = spans.get_finished_spans()
    compaction = next(s for s in finished if s.name.startswith("compact_events"))
    chat = next(s for s in finished if s.name == "chat openai/primary")
    attrs = compaction.attributes or {}
    assert compaction.name == "compact_events summarize"
    assert attrs["gen_ai.compaction.trigger"] == "manual"
    assert attrs["gen_ai.compaction.strategy"] == "summarize"
    assert attrs["gen_ai.compaction.tokens_before"] - attrs["gen_ai.compaction.tokens_after"] == (
        saved
    )
    assert attrs["gen_ai.compaction.outcome"] == "applied"
    assert chat.parent is not None and chat.parent.span_id == compaction.context.span_id
    assert chat.kind == SpanKind.CLIENT
    usage = chat.attributes or {}
    assert chat.status.status_code != StatusCode.ERROR and "error.type" not in usage
    (request,) = fake.calls("primary")
    assert usage["gen_ai.operation.name"] == "chat"
    assert usage["gen_ai.provider.name"] == "openai"
    assert usage["gen_ai.usage.input_tokens"] > 0 and usage["gen_ai.usage.output_tokens"] > 0
    assert usage["gen_ai.request.max_tokens"] == request.body["max_tokens"]


async def test_the_service_continues_the_callers_trace(
    pg_dsn: str, spans: InMemorySpanExporter
) -> None:
    trace_id, parent_id = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    async with running_service(Settings(dsn=pg_dsn, migrate=False)) as svc:
        await svc.client.post("/v1/sessions", json={"session_id": "s"})
        spans.clear()
        r = await svc.client.post(
            "/v1/sessions/s/messages",
            json={"message": {"role": "user", "content": "hi"}},
            headers={"traceparent": f"00-{trace_id}-{parent_id}-01"},
        )
        assert r.status_code == 201
        (made,) = [s for s in spans.get_finished_spans() if s.name == "create_memory"]
        assert f"{made.context.trace_id:032x}" == trace_id
        assert made.parent is not None and f"{made.parent.span_id:016x}" == parent_id
        spans.clear()
        bad = await svc.client.post(  # a malformed header starts a new trace
            "/v1/sessions/s/messages",
            json={"message": {"role": "user", "content": "again"}},
            headers={"traceparent": "00-zz-" + "x" * 2000},
        )
        assert bad.status_code == 201
        (fresh,) = [s for s in spans.get_finished_spans() if s.name == "create_memory"]
        assert f"{fresh.context.trace_id:032x}" != trace_id and fresh.parent is None
