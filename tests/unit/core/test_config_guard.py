"""The config is validated whole before anything is written: only typed errors come out."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contextledger.core.config import MAX_CONFIG_BYTES, ContextConfig
from contextledger.errors import ConfigError, ContextLedgerError
from tests.examples import examples

ALIAS_BOMB = "\n".join(
    ["a: &a [x, x, x, x, x, x, x, x, x, x]"]
    + [f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 10)}]" for i in range(8)]
)


@pytest.mark.parametrize(
    ("text", "needle", "line"),
    [
        ("keep_recent: 3\nprofile: [unclosed\n", "line 3", 3),
        ("keep_recent: 3\n  bad: indent\n", "line 2", 2),
    ],
)
def test_yaml_errors_name_the_line(text: str, needle: str, line: int) -> None:
    with pytest.raises(ConfigError) as info:
        ContextConfig.from_mapping(text)
    assert needle in str(info.value)
    assert info.value.details["line"] == line


@pytest.mark.parametrize(
    ("raw", "key"),
    [
        ("keep_recent: !!python/object/apply:os.system ['true']", "<root>"),
        ("min_score: !!binary aGVsbG8=", "min_score"),
        (ALIAS_BOMB, ""),  # stopped at whichever node crosses the cap
        ("x" * (MAX_CONFIG_BYTES + 1), "<root>"),
        ({"model_overrides": {"m": {"context_window": math.nan}}}, "model_overrides.m"),
        ({"model_overrides": {"m": {"weird": math.inf}}}, "model_overrides.m.weird"),
        ({"model_overrides": {"m": {"context_window": -5}}}, "model_overrides.m.context_window"),
        ({"model_overrides": {"m": 3}}, "model_overrides.m"),
        ({"protected_tools": ["a\x00b"]}, "protected_tools[0]"),
        ({"protected_tools": ["a\ud800"]}, "protected_tools[0]"),
        ({"summarizer": {"models": [{"model": "m", "api_base": "\x00"}]}}, "summarizer"),
        ({"min_score": float("nan")}, "min_score"),
        ({"max_message_bytes": 10}, "max_message_bytes"),
        ("compact_threshold: .nan", "compact_threshold"),
        ("min_score: 2001-01-01", "min_score"),
    ],
)
def test_bad_configs_are_config_errors(raw: Any, key: str) -> None:
    with pytest.raises(ConfigError) as info:
        ContextConfig.from_mapping(raw)
    assert str(info.value.details["key"]).startswith(key)


def test_merged_checks_overrides_too() -> None:
    base = ContextConfig.from_mapping({"keep_recent": 4})
    with pytest.raises(ConfigError):
        base.merged("keep_recent: [")
    with pytest.raises(ConfigError):
        base.merged({"model_overrides": {"m": {"context_window": math.inf}}})
    assert base.merged({"max_message_bytes": 2048}).max_message_bytes == 2048


plain = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | st.text(alphabet=st.characters(codec=None)),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
keys = st.sampled_from([*sorted(ContextConfig.keys()), "dsn", "nope"])


@settings(max_examples=examples(300), deadline=None)
@given(st.dictionaries(keys, plain, max_size=5))
def test_fuzzed_mappings_only_raise_typed_errors(raw: dict[str, Any]) -> None:
    try:
        config = ContextConfig.from_mapping(raw)
    except ContextLedgerError as exc:
        assert exc.code
        return
    # accepted configs round-trip through their recorded form
    assert ContextConfig.from_mapping(config.to_dict()).to_dict() == config.to_dict()


@settings(max_examples=examples(300), deadline=None)
@given(st.text(alphabet=st.characters(codec=None), max_size=200))
def test_fuzzed_yaml_text_only_raises_typed_errors(text: str) -> None:
    try:
        ContextConfig.from_mapping(text)
    except ContextLedgerError as exc:
        assert exc.code == "INVALID_CONFIG"
