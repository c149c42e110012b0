"""Budgets, output reserve policy, thresholds and states: values computed by hand."""

from __future__ import annotations

import warnings
from types import SimpleNamespace
from typing import Any

import pytest

from contextledger.core.budget import (
    PROFILES,
    Budget,
    Pressure,
    PressureThresholds,
    budget_for,
    budget_from_provider,
    output_reserve,
    provider_limits,
    safety_margin,
    state_for,
    thresholds_for,
    usage,
)
from contextledger.core.model_limits import model_limits
from contextledger.errors import CompactionError, ConfigError, InvalidArgument

# --- budgets for real models ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "reserve", "margin", "available"),
    [
        # gpt-4o: 128000 window, 16384 max output; <=128K policy cap 30000 -> 16384
        # margin min(1000, ceil(128000*0.02) = 2560) = 1000; 128000 - 16384 - 1000 = 110616
        ("gpt-4o", 16_384, 1000, 110_616),
        # claude-sonnet-4: 200000 / 64000; <=200K cap 40000 -> 40000; 200000 - 40000 - 1000
        ("claude-sonnet-4-20250514", 40_000, 1000, 159_000),
        # ollama/llama3.1: 8192 / 8192; <=64K cap 27000 -> 8192; <=32K: 25% of 8192 = 2048
        # margin ceil(8192*0.02) = ceil(163.84) = 164; 8192 - 2048 - 164 = 5980
        ("ollama/llama3.1", 2048, 164, 5980),
        # unknown: default 8192 window, no max output -> 4096 -> 25% cap 2048; same as above
        ("some-unknown-model-xyz", 2048, 164, 5980),
        # gemini-2.5-pro: 1048576 / 65536; cap max(40000, 1048576//5 = 209715) -> 65536
        # 1048576 - 65536 - 1000 = 982040
        ("gemini/gemini-2.5-pro", 65_536, 1000, 982_040),
    ],
)
def test_budget_for_models(model: str, reserve: int, margin: int, available: int) -> None:
    limits = model_limits(model)
    budget = budget_for(limits.context_window, limits.max_output_tokens)
    assert (budget.output_reserve, budget.safety_margin, budget.available) == (
        reserve,
        margin,
        available,
    )


def test_budget_arithmetic_and_system_reserve() -> None:
    # 10000 - 2000 - 200 - 1000 = 6800
    assert Budget(10_000, 2000, 200, 1000).available == 6800
    # gpt-4o with a request max_tokens of 4000: 128000 - 4000 - 1000 = 123000
    assert budget_for(128_000, 16_384, request_max_tokens=4000).available == 123_000
    # explicit margin and system reserve: 128000 - 16384 - 500 - 3000 = 108116
    assert budget_for(128_000, 16_384, margin=500, system_reserve=3000).available == 108_116


def test_no_budget_raises_never_negative() -> None:
    with pytest.raises(CompactionError) as exc:
        Budget(1000, 500, 500)  # 1000 - 500 - 500 = 0
    assert exc.value.code == "NO_TOKEN_BUDGET"
    assert exc.value.details["context_window"] == 1000
    with pytest.raises(CompactionError):
        # 1000 - request 1000 - margin ceil(20) = -20
        budget_for(1000, request_max_tokens=1000)
    with pytest.raises(CompactionError):
        budget_for(8192, 8192, system_reserve=6000)  # 8192 - 2048 - 164 - 6000 = -20
    with pytest.raises(InvalidArgument):
        Budget(8192, -1, 0)


# --- output reserve policy -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("window", "max_output", "expected"),
    [
        (65_536, 100_000, 27_000),  # <=64K
        (65_537, 100_000, 30_000),  # <=128K
        (131_072, 100_000, 30_000),
        (131_073, 100_000, 40_000),  # <=200K
        (200_000, 100_000, 40_000),
        (200_001, 100_000, 40_000),  # max(40000, 200001//5 = 40000)
        (1_000_000, 500_000, 200_000),  # max(40000, 20% = 200000)
        (1_000_000, 65_536, 65_536),  # the model's own max output is smaller
        (32_768, 20_000, 8192),  # <=32K: 25% of 32768
        (32_769, 20_000, 20_000),  # just above: no small-window cap
        (128_000, None, 4096),  # nothing known: Amplifier default
        (16_384, None, 4096),  # 25% of 16384 = 4096
        (8192, None, 2048),  # 25% of 8192
    ],
)
def test_output_reserve_policy(window: int, max_output: int | None, expected: int) -> None:
    assert output_reserve(window, max_output) == expected


def test_output_reserve_request_and_cap() -> None:
    # The request's max_tokens is what the provider reserves: taken as is, even on 8K.
    assert output_reserve(8192, 8192, request_max_tokens=6000) == 6000
    assert output_reserve(128_000, 16_384, request_max_tokens=1000) == 1000
    # An explicit cap wins when smaller, on every path.
    assert output_reserve(128_000, 16_384, config_max_tokens_cap=8000) == 8000
    assert output_reserve(128_000, 16_384, config_max_tokens_cap=50_000) == 16_384
    assert (
        output_reserve(128_000, None, request_max_tokens=9000, config_max_tokens_cap=5000) == 5000
    )


def test_safety_margin_scales_down() -> None:
    assert safety_margin(200_000) == 1000
    assert safety_margin(50_000) == 1000  # 2% = 1000 exactly
    assert safety_margin(8192) == 164  # ceil(163.84)
    assert safety_margin(4096) == 82  # ceil(81.92)


# --- provider contract ---------------------------------------------------------------------


class _Provider:
    def __init__(self, info: Any) -> None:
        self._info = info

    def get_info(self) -> Any:
        return self._info


def test_budget_from_provider_dict_and_attribute_defaults() -> None:
    as_dict = _Provider(
        SimpleNamespace(defaults={"context_window": 200_000, "max_output_tokens": 64_000})
    )
    as_attrs = _Provider(
        SimpleNamespace(defaults=SimpleNamespace(context_window=200_000, max_output_tokens=64_000))
    )
    for provider in (as_dict, as_attrs):
        assert provider_limits(provider) == (200_000, 64_000)
        budget = budget_from_provider(provider)
        assert budget is not None
        # 200000 - min(64000, 40000) - 1000 = 159000
        assert budget.available == 159_000


def test_budget_from_amplifier_provider_info() -> None:
    from amplifier_core.models import ProviderInfo

    info = ProviderInfo(id="openai", display_name="OpenAI", defaults={"context_window": 128_000})
    budget = budget_from_provider(_Provider(info))
    assert budget is not None
    # no max_output_tokens -> 4096; 128000 - 4096 - 1000 = 122904
    assert budget.available == 122_904


def test_budget_from_provider_missing_values() -> None:
    empty = _Provider(SimpleNamespace(defaults={}))
    assert provider_limits(empty) == (None, None)
    assert budget_from_provider(empty) is None
    # fall back to model limits: 8192 window, 8192 max output -> 5980 (see above)
    fallback = budget_from_provider(
        empty, fallback_context_window=8192, fallback_max_output_tokens=8192
    )
    assert fallback is not None and fallback.available == 5980
    assert provider_limits(object()) == (None, None)

    class Broken:
        def get_info(self) -> Any:
            raise RuntimeError("boom")

    assert provider_limits(Broken()) == (None, None)

    class Async:
        async def get_info(self) -> Any:
            return SimpleNamespace(defaults={"context_window": 1})

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "coroutine was never awaited" would fail here
        assert provider_limits(Async()) == (None, None)


# --- thresholds and states ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("thresholds", "warning", "critical", "overflow"),
    [
        (PROFILES["conservative"], 7000, 8000, 9000),
        (PROFILES["balanced"], 7500, 8500, 9500),
        (PROFILES["aggressive"], 8500, 9200, 9700),
        (thresholds_for("gemini-2.5-pro"), 8800, 9400, 9800),
    ],
)
def test_every_boundary_is_inclusive(
    thresholds: PressureThresholds, warning: int, critical: int, overflow: int
) -> None:
    budget = 10_000  # tokens / 10000 gives the exact threshold fraction
    assert usage(warning - 1, budget, thresholds).state is Pressure.HEALTHY
    assert usage(warning, budget, thresholds).state is Pressure.WARNING
    assert usage(critical - 1, budget, thresholds).state is Pressure.WARNING
    assert usage(critical, budget, thresholds).state is Pressure.CRITICAL
    assert usage(overflow - 1, budget, thresholds).state is Pressure.CRITICAL
    assert usage(overflow, budget, thresholds).state is Pressure.OVERFLOW


def test_state_for_fractions() -> None:
    balanced = PROFILES["balanced"]
    assert state_for(0.75, balanced) == "warning"
    assert state_for(0.7499, balanced) == "healthy"
    assert state_for(0.85, balanced) == "critical"
    assert state_for(0.8499, balanced) == "warning"
    assert state_for(0.95, balanced) == "overflow"
    assert state_for(0.9499, balanced) == "critical"
    assert state_for(1.7, balanced) == "overflow"
    assert state_for(0.0, balanced) == "healthy"


@pytest.mark.parametrize(
    ("model", "name"),
    [
        ("gemini-2.5-pro", "gemini"),
        ("gemini/gemini-2.5-flash", "gemini"),
        ("deepseek-chat", "aggressive"),
        ("deepseek/deepseek-reasoner", "aggressive"),
        ("claude-opus-4-1-20250805", "conservative"),
        ("claude-sonnet-4-20250514", "balanced"),
        ("gpt-4o", "balanced"),
        (None, "balanced"),
    ],
)
def test_thresholds_per_model(model: str | None, name: str) -> None:
    assert thresholds_for(model).name == name


def test_threshold_values_and_profile_override() -> None:
    assert thresholds_for("gemini-2.5-pro") == PressureThresholds(0.88, 0.94, 0.98, "gemini")
    assert thresholds_for("gpt-4o") == PressureThresholds(0.75, 0.85, 0.95, "balanced")
    assert thresholds_for("gemini-2.5-pro", "conservative") == PressureThresholds(
        0.70, 0.80, 0.90, "conservative"
    )
    custom = PressureThresholds(0.5, 0.6, 0.7)
    assert thresholds_for("gpt-4o", custom) is custom
    with pytest.raises(ConfigError):
        thresholds_for("gpt-4o", "yolo")
    with pytest.raises(ConfigError):
        PressureThresholds(0.9, 0.8, 0.95)
    with pytest.raises(ConfigError):
        PressureThresholds(0.5, 0.6, 1.5)


def test_usage_record() -> None:
    budget = Budget(128_000, 16_384, 1000)  # available 110616
    u = usage(55_308, budget, PROFILES["balanced"])
    assert (u.tokens, u.budget, u.fraction, u.state) == (55_308, 110_616, 0.5, Pressure.HEALTHY)
    over = usage(221_232, budget, PROFILES["balanced"])
    assert over.fraction == 2.0 and over.state is Pressure.OVERFLOW
    with pytest.raises(InvalidArgument):
        usage(-1, budget, PROFILES["balanced"])
    with pytest.raises(CompactionError):
        usage(10, 0, PROFILES["balanced"])
