"""RetryPolicy: bounded, jittered, and only on LedgerUnavailable."""

from __future__ import annotations

import pytest

from contextledger import Ledger
from contextledger.errors import InvalidArgument, LedgerRefused, LedgerUnavailable
from contextledger.retry import RetryPolicy


async def test_retries_unavailable_then_gives_up() -> None:
    calls: list[int] = []

    async def flaky() -> int:
        calls.append(1)
        if len(calls) < 3:
            raise LedgerUnavailable("down", code="CONNECTION_REFUSED")
        return 7

    policy = RetryPolicy(attempts=3, base_delay=0.001, max_delay=0.002)
    assert await policy.run(flaky) == 7
    assert len(calls) == 3

    async def down() -> int:
        calls.append(1)
        raise LedgerUnavailable("down")

    calls.clear()
    with pytest.raises(LedgerUnavailable):
        await policy.run(down)
    assert len(calls) == 3


async def test_refusals_are_not_retried() -> None:
    calls: list[int] = []

    async def refused() -> int:
        calls.append(1)
        raise LedgerRefused("ro", code="READ_ONLY")

    with pytest.raises(LedgerRefused):
        await RetryPolicy(attempts=4, base_delay=0).run(refused)
    assert len(calls) == 1


def test_delays_are_bounded() -> None:
    policy = RetryPolicy(attempts=10, base_delay=0.1, max_delay=0.5)
    assert all(0 <= policy.delay(a) <= 0.5 for a in range(30))


@pytest.mark.parametrize(
    "kwargs", [{"attempts": 0}, {"attempts": True}, {"base_delay": -1}, {"max_delay": 100}]
)
def test_bad_policies_are_invalid(kwargs: dict[str, float]) -> None:
    with pytest.raises(InvalidArgument):
        RetryPolicy(**kwargs)  # type: ignore[arg-type]


async def test_ledger_takes_a_policy() -> None:
    policy = RetryPolicy(attempts=2)
    async with Ledger.open("memory://", retry_appends=policy) as ledger:
        assert ledger.retry_appends is policy
        s = await ledger.session("s")
        assert await s.add_message({"role": "user", "content": "x"}, idempotency_key="k") == 2
    with pytest.raises(InvalidArgument):
        await Ledger.open("memory://", retry_appends=3)  # type: ignore[arg-type]
