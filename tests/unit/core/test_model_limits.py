"""Model limits from litellm's bundled map, offline, with overrides and defaults."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from contextledger.core.budget import provider_limits
from contextledger.core.config import ContextConfig
from contextledger.core.model_limits import (
    DEFAULT_CONTEXT_WINDOW,
    ModelLimits,
    bare_model_name,
    clear_cache,
    model_limits,
    name_candidates,
    positive_int,
)
from contextledger.errors import ConfigError

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(autouse=True)
def fresh_cache() -> Iterator[None]:
    clear_cache()
    yield
    clear_cache()


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(self: socket.socket, address: Any) -> None:
        raise AssertionError(f"network call to {address}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)


def test_pure_modules_do_not_import_litellm() -> None:
    # nor does a window the map file litellm ships answers (litellm's import: ~1.5 s)
    code = (
        "import contextledger.core.model_limits, contextledger.core.budget, "
        "contextledger.core.images, sys; "
        "print('litellm' in sys.modules); "
        "from contextledger.core.model_limits import model_limits; "
        "print(model_limits('openai/gpt-4o').context_window, 'litellm' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "128000", "False"]


@pytest.mark.parametrize(
    ("model", "window", "max_output"),
    [
        # window = max_input_tokens, not get_max_tokens (the output limit, 64000 here)
        ("claude-sonnet-4-20250514", 200_000, 64_000),
        ("anthropic/claude-sonnet-4-20250514", 200_000, 64_000),
        ("gpt-4o", 128_000, 16_384),
        ("openai/gpt-4o", 128_000, 16_384),
        ("azure/gpt-4o", 128_000, 16_384),
        ("gpt-4o-2024-08-06", 128_000, 16_384),
        ("ollama/llama3.1", 8192, 8192),
        ("ollama/llama3.1:8b", 8192, 8192),  # Ollama tag stripped
        ("gemini/gemini-2.5-pro", 1_048_576, 65_536),
        ("deepseek-chat", 131_072, 8192),
    ],
)
def test_limits_from_litellm_map(
    model: str, window: int, max_output: int, no_network: None
) -> None:
    limits = model_limits(model)
    assert (limits.context_window, limits.max_output_tokens) == (window, max_output)
    assert limits.source.startswith("litellm:")


@pytest.mark.parametrize(
    ("model", "window", "max_output", "source"),
    [
        ("claude-3-5-sonnet-20241022", 200_000, 8192, "builtin:claude-3-5-sonnet*"),
        ("claude-3-7-sonnet-latest", 200_000, 8192, "builtin:claude-3-7-sonnet*"),
        ("claude-3-opus-20240229", 200_000, 4096, "builtin:claude-3-opus*"),
        ("llama3.1", 131_072, 4096, "builtin:llama3.[1-9]*"),
        ("meta-llama/llama-3.3-70b-instruct", 131_072, 4096, "builtin:llama-3.[1-9]*"),
        ("ollama/llama3.2", 8192, 8192, "builtin:ollama/llama3*"),
    ],
)
def test_builtin_table_fills_map_gaps(
    model: str, window: int, max_output: int, source: str, no_network: None
) -> None:
    assert model_limits(model) == ModelLimits(window, max_output, source)


def test_live_lookup_providers_stay_offline(no_network: None) -> None:
    # litellm's get_model_info would POST to localhost:11434 / :8000 for these.
    for model in ("ollama/qwen2.5", "ollama_chat/mistral-nemo", "lemonade/x", "hosted_vllm/x"):
        assert model_limits(model).source == "default"


def test_unknown_model_default_and_single_warning(
    capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture, no_network: None
) -> None:
    with caplog.at_level(logging.WARNING, logger="contextledger.core.model_limits"):
        first = model_limits("totally-unknown-model")
        again = model_limits("totally-unknown-model")
        other = model_limits("another-unknown", default_context_window=32_000)
    assert first == again == ModelLimits(DEFAULT_CONTEXT_WINDOW, None, "default")
    assert first.context_window == 8192
    assert other == ModelLimits(32_000, None, "default")
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert [r.model for r in warnings] == ["totally-unknown-model", "another-unknown"]  # type: ignore[attr-defined]
    # The hint names the key that really exists (it once said ``models.<name>``).
    assert all("model_overrides" in r.getMessage() for r in warnings)
    assert all("models.<" not in r.getMessage() for r in warnings)
    # ...and the key it names is accepted as written
    ContextConfig.from_mapping(
        {"model_overrides": {"totally-unknown-model": {"context_window": 9}}}
    )
    out, err = capfd.readouterr()
    assert "Provider List" not in out + err and "LiteLLM" not in out + err


def test_user_overrides_win() -> None:
    overrides = {
        "gpt-4o": {"context_window": 64_000},
        "my-local-model": {"context_window": 32_768, "max_output_tokens": 2048},
    }
    # bare-name override applies to a prefixed spelling; max output still from the map
    assert model_limits("openai/gpt-4o", overrides) == ModelLimits(64_000, 16_384, "override")
    assert model_limits("my-local-model", overrides) == ModelLimits(32_768, 2048, "override")
    # output-only override on a known model
    only_out = {"claude-sonnet-4-20250514": {"max_output_tokens": 8000}}
    assert model_limits("claude-sonnet-4-20250514", only_out) == ModelLimits(
        200_000, 8000, "override"
    )


def test_bad_overrides_are_config_errors() -> None:
    with pytest.raises(ConfigError):
        model_limits("unknown-x", {"unknown-x": {"max_output_tokens": 100}})  # no window known
    with pytest.raises(ConfigError) as info:
        model_limits("gpt-4o", {"gpt-4o": {"context_window": -5}})
    assert info.value.details["key"].startswith("model_overrides.")
    with pytest.raises(ConfigError):
        model_limits("gpt-4o", {"gpt-4o": {"context_window": "big"}})
    with pytest.raises(ConfigError):
        model_limits("  ")


def test_results_are_cached() -> None:
    assert model_limits("gpt-4o") is model_limits("gpt-4o")


def test_name_helpers() -> None:
    assert bare_model_name("openrouter/anthropic/Claude-Sonnet-4") == "claude-sonnet-4"
    assert bare_model_name(None) == ""
    assert name_candidates("azure/gpt-4o-2024-08-06") == (
        "azure/gpt-4o-2024-08-06",
        "azure/gpt-4o",
        "gpt-4o-2024-08-06",
        "gpt-4o",
    )
    assert name_candidates("claude-sonnet-4-20250514") == (
        "claude-sonnet-4-20250514",
        "claude-sonnet-4",
    )
    assert name_candidates("gpt-4-0613")[-1] == "gpt-4"


# -- one reading of a token count from data we do not own ------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (128_000, 128_000),
        (4096.0, 4096),
        (1, 1),
        (0, None),
        (0.5, None),  # was a window of 0 in one copy
        (-3, None),
        (float("nan"), None),  # was a ValueError in one copy, None in the other
        (float("inf"), None),  # was an OverflowError
        (True, None),
        ("8192", None),
        (None, None),
    ],
)
def test_positive_int(value: object, expected: int | None) -> None:
    assert positive_int(value) == expected


@given(st.one_of(st.floats(), st.integers(), st.booleans(), st.none(), st.text()))
def test_positive_int_is_none_or_at_least_one_and_never_raises(value: object) -> None:
    result = positive_int(value)
    assert result is None or (type(result) is int and result >= 1)


def test_a_provider_reporting_nan_has_no_limit_instead_of_crashing() -> None:
    class Info:
        defaults = {"context_window": float("nan"), "max_output_tokens": 0.5}

    class Provider:
        def get_info(self) -> Info:
            return Info()

    assert provider_limits(Provider()) == (None, None)
