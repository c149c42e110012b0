"""HookBus and the pre-compact decision: observers can never break the caller."""

from __future__ import annotations

from typing import Any

import pytest
from structlog.testing import capture_logs

from contextledger.hooks import (
    INCLUDE,
    MESSAGE_ADDED,
    OVERFLOW,
    POST_COMPACT,
    PRE_COMPACT,
    SUMMARIZATION,
    CompactContext,
    CompactDecision,
    HookBus,
    decide,
)

CTX = CompactContext(
    trigger="manual",
    current_tokens=9000,
    target_tokens=4000,
    message_count=42,
    custom_instructions="keep the SQL",
)


def test_event_names_are_stable() -> None:
    assert (MESSAGE_ADDED, INCLUDE, PRE_COMPACT, POST_COMPACT, OVERFLOW, SUMMARIZATION) == (
        "context:message_added:debug",
        "context:include",
        "context:pre_compact",
        "context:post_compact",
        "context:overflow",
        "context:summarization",
    )


async def test_sync_and_async_handlers_in_order() -> None:
    bus = HookBus()
    seen: list[tuple[str, str, Any]] = []

    def sync_handler(event: str, data: dict[str, Any]) -> None:
        seen.append(("sync", event, data["n"]))

    async def async_handler(event: str, data: dict[str, Any]) -> None:
        seen.append(("async", event, data["n"]))

    bus.on(OVERFLOW, sync_handler)
    bus.on(OVERFLOW, async_handler)
    await bus.emit(OVERFLOW, {"n": 1})
    await bus.emit(SUMMARIZATION, {"n": 2})  # nobody listens: no call, no error
    assert seen == [("sync", OVERFLOW, 1), ("async", OVERFLOW, 1)]


async def test_failing_listener_is_isolated_and_logged() -> None:
    bus = HookBus()
    seen: list[str] = []

    def broken(event: str, data: dict[str, Any]) -> None:
        raise ValueError("listener bug")

    async def broken_async(event: str, data: dict[str, Any]) -> None:
        raise RuntimeError("async listener bug")

    bus.on(POST_COMPACT, broken)
    bus.on(POST_COMPACT, broken_async)
    bus.on(POST_COMPACT, lambda e, d: seen.append(e))
    with capture_logs() as logs:
        await bus.emit(POST_COMPACT, {"tokens_saved": 10})
    assert seen == [POST_COMPACT]
    failures = [entry for entry in logs if entry["event"] == "hook_failed"]
    assert [f["error"] for f in failures] == [
        "ValueError: listener bug",
        "RuntimeError: async listener bug",
    ]
    assert all(f["hook_event"] == POST_COMPACT and f["log_level"] == "warning" for f in failures)


async def test_wildcard_sees_every_event() -> None:
    bus = HookBus()
    seen: list[str] = []
    bus.on("*", lambda e, d: seen.append(e))
    await bus.emit(INCLUDE, {})
    await bus.emit(MESSAGE_ADDED, {})
    assert seen == [INCLUDE, MESSAGE_ADDED]
    assert bus.has_listeners("anything")


async def test_unsubscribe() -> None:
    bus = HookBus()
    seen: list[str] = []
    off = bus.on(OVERFLOW, lambda e, d: seen.append(e))
    await bus.emit(OVERFLOW, {})
    off()
    off()  # idempotent
    await bus.emit(OVERFLOW, {})
    assert seen == [OVERFLOW]
    assert not bus.has_listeners(OVERFLOW)


async def test_handlers_cannot_change_what_the_next_one_sees() -> None:
    bus = HookBus()
    got: list[dict[str, Any]] = []

    def meddler(event: str, data: dict[str, Any]) -> None:
        data["tokens"] = -1

    bus.on(OVERFLOW, meddler)
    bus.on(OVERFLOW, lambda e, d: got.append(d))
    original = {"tokens": 5}
    await bus.emit(OVERFLOW, original)
    assert got == [{"tokens": 5}] and original == {"tokens": 5}


class Coordinator:
    """Stands in for an Amplifier coordinator's ``hooks`` (only ``emit`` is used)."""

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.events: list[tuple[str, dict[str, Any]]] = []

    async def emit(self, event: str, data: dict[str, Any]) -> None:
        self.events.append((event, data))
        if self.fail:
            raise ConnectionError("coordinator gone")


async def test_forward_to() -> None:
    hooks = Coordinator()
    bus = HookBus(forward_to=hooks)
    await bus.emit(SUMMARIZATION, {"summary_length": 120})
    assert hooks.events == [(SUMMARIZATION, {"summary_length": 120})]


async def test_forward_to_errors_are_contained() -> None:
    hooks = Coordinator(fail=True)
    local: list[str] = []
    bus = HookBus(forward_to=hooks)
    bus.on(OVERFLOW, lambda e, d: local.append(e))
    with capture_logs() as logs:
        await bus.emit(OVERFLOW, {})
    assert local == [OVERFLOW] and len(hooks.events) == 1
    assert [entry["handler"] for entry in logs if entry["event"] == "hook_failed"] == ["forward_to"]


# ---------------------------------------------------------------- decide()


async def test_decide_without_handler_keeps_instructions() -> None:
    assert await decide(None, CTX) == CompactDecision(custom_instructions="keep the SQL")


async def test_decide_sync_and_async() -> None:
    def cancel(ctx: CompactContext) -> CompactDecision:
        return CompactDecision(cancel=ctx.trigger == "manual")

    async def steer(ctx: CompactContext) -> CompactDecision:
        return CompactDecision(
            custom_instructions=f"{ctx.message_count} msgs", custom_summary="given"
        )

    assert (await decide(cancel, CTX)).cancel
    assert await decide(steer, CTX) == CompactDecision(
        custom_instructions="42 msgs", custom_summary="given"
    )
    assert await decide(lambda ctx: None, CTX) == CompactDecision(
        custom_instructions="keep the SQL"
    )


@pytest.mark.parametrize("kind", ["raises", "raises_async", "wrong_type"])
async def test_decide_failing_handler_gives_default(kind: str) -> None:
    def raises(ctx: CompactContext) -> CompactDecision:
        raise KeyError("boom")

    async def raises_async(ctx: CompactContext) -> CompactDecision:
        raise TimeoutError

    def wrong_type(ctx: CompactContext) -> Any:
        return {"cancel": True}

    handler = {"raises": raises, "raises_async": raises_async, "wrong_type": wrong_type}[kind]
    with capture_logs() as logs:
        decision = await decide(handler, CTX)
    assert decision == CompactDecision(custom_instructions="keep the SQL")
    assert not decision.cancel
    assert [entry["event"] for entry in logs] == ["hook_failed"]
    assert logs[0]["handler"].endswith(kind)
