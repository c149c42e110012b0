"""Retention policies (retention.py): validation and the pure decision."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from contextledger.errors import ConfigError
from contextledger.retention import MAX_DAYS, RetentionPolicy, decide


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({}, "needs erase_after_days or purge_after_days"),
        ({"erase_after_days": 0}, "1..36500"),
        ({"erase_after_days": True}, "whole number"),
        ({"purge_after_days": 1.5}, "whole number"),
        ({"purge_after_days": "30"}, "whole number"),
        ({"erase_after_days": MAX_DAYS + 1}, "1..36500"),
        ({"erase_after_days": 30, "purge_after_days": 30}, "later than"),
        ({"erase_after_days": 30, "keep": 1}, "unknown retention setting"),
        ([30], "a mapping"),
    ],
)
def test_bad_policies_are_typed(value: Any, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        RetentionPolicy.from_mapping(value)


def test_a_policy_round_trips() -> None:
    policy = RetentionPolicy.from_mapping({"erase_after_days": 30, "purge_after_days": 400})
    assert RetentionPolicy.from_mapping(policy.to_dict()) == policy


policies = st.one_of(
    st.builds(RetentionPolicy, st.integers(1, 1000), st.none()),
    st.builds(lambda p: RetentionPolicy(None, p), st.integers(1, 1000)),
    st.builds(lambda e, gap: RetentionPolicy(e, e + gap), st.integers(1, 1000), st.integers(1, 99)),
)


@given(policies, st.floats(0, 5000), st.booleans(), st.booleans())
def test_decide_acts_only_past_a_limit_and_never_erases_twice_or_in_clear(
    policy: RetentionPolicy, idle: float, erased: bool, sealed: bool
) -> None:
    verdict = decide(policy, idle_days=idle, erased=erased, sealed=sealed or erased)
    limits = [d for d in (policy.erase_after_days, policy.purge_after_days) if d is not None]
    if idle < min(limits):
        assert verdict is None
        return
    if verdict is None:
        assert erased and (policy.purge_after_days is None or idle < policy.purge_after_days)
        return
    action, why = verdict
    if action == "purge":
        assert policy.purge_after_days is not None and idle >= policy.purge_after_days
    elif action == "erase":
        assert not erased and (sealed or erased) and "erase_after_days" in why
    else:
        assert not sealed and not erased and "purge_after_days" in why
