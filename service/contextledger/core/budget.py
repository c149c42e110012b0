"""Token budgets and context-pressure states. Pure: limits come in as arguments.

``available`` = context window - output reserve - safety margin - system reserve:
the tokens the conversation itself may use. ``usage(tokens, budget, thresholds)``
turns a token count into a fraction of that and a state
(``healthy`` < warning <= ``warning`` < critical <= ``critical`` < overflow <=
``overflow``; every boundary belongs to the higher state).
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from contextledger.core.config import ContextConfig
from contextledger.core.model_limits import (
    ModelLimits,
    bare_model_name,
    model_limits,
    positive_int,
)
from contextledger.core.providers import model_family
from contextledger.errors import CompactionError, ConfigError, InvalidArgument

__all__ = [
    "DEFAULT_MAX_OUTPUT_TOKENS",
    "DEFAULT_SAFETY_MARGIN",
    "PROFILES",
    "Budget",
    "Pressure",
    "PressureThresholds",
    "Usage",
    "budget_for",
    "budget_from_provider",
    "output_reserve",
    "provider_limits",
    "safety_margin",
    "state_for",
    "thresholds_for",
    "usage",
]

DEFAULT_MAX_OUTPUT_TOKENS = 4096
"""The Amplifier contract's default ``max_output_tokens`` when nothing else is known."""

DEFAULT_SAFETY_MARGIN = 1000
"""The Amplifier contract's safety margin (tokenizer drift, provider-side framing)."""

SMALL_WINDOW = 32_768
SMALL_WINDOW_RESERVE_FRACTION = 0.25


@dataclass(frozen=True, slots=True)
class Budget:
    """What a request may spend on conversation; construction fails rather than go <= 0."""

    context_window: int
    output_reserve: int
    safety_margin: int
    system_reserve: int = 0

    def __post_init__(self) -> None:
        for field in ("context_window", "output_reserve", "safety_margin", "system_reserve"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise InvalidArgument(f"{field} must be an int >= 0, got {value!r}", field=field)
        if self.available <= 0:
            raise CompactionError(
                f"no token budget left: window {self.context_window} - output reserve "
                f"{self.output_reserve} - safety margin {self.safety_margin} - system reserve "
                f"{self.system_reserve} = {self.available}",
                code="NO_TOKEN_BUDGET",
                context_window=self.context_window,
                output_reserve=self.output_reserve,
                safety_margin=self.safety_margin,
                system_reserve=self.system_reserve,
            )

    @property
    def available(self) -> int:
        """Tokens the request's messages may take: the window less the output reserve,
        the safety margin and the system prompt's reserve."""
        return self.context_window - self.output_reserve - self.safety_margin - self.system_reserve


def _policy_cap(context_window: int) -> int:
    """Largest output reserve taken from a model's advertised max output.

    Models advertise outputs (64K, 128K) far beyond what a turn uses; reserving all
    of it would halve the conversation. <=64K window: 27K; <=128K: 30K; <=200K: 40K;
    larger: max(40K, 20% of the window).
    """
    if context_window <= 65_536:
        return 27_000
    if context_window <= 131_072:
        return 30_000
    if context_window <= 200_000:
        return 40_000
    return max(40_000, context_window // 5)


def output_reserve(
    context_window: int,
    max_output_tokens: int | None = None,
    request_max_tokens: int | None = None,
    config_max_tokens_cap: int | None = None,
) -> int:
    """Tokens kept free for the reply.

    1. The request's ``max_tokens`` when given: the provider reserves exactly that,
       so it is taken as is (only ``config_max_tokens_cap`` may lower it).
    2. Else the model's ``max_output_tokens`` capped by :func:`_policy_cap`.
    3. Else :data:`DEFAULT_MAX_OUTPUT_TOKENS` (4096).

    ``config_max_tokens_cap`` wins when smaller. For windows <= 32K, the reserve from
    2 or 3 is capped at 25% of the window: an 8K local model whose map row says
    "max output 8192" must still leave room for the conversation (8192 -> 2048).
    """
    if request_max_tokens is not None:
        reserve = request_max_tokens
    else:
        if max_output_tokens is not None:
            reserve = min(max_output_tokens, _policy_cap(context_window))
        else:
            reserve = DEFAULT_MAX_OUTPUT_TOKENS
        if context_window <= SMALL_WINDOW:
            reserve = min(reserve, int(context_window * SMALL_WINDOW_RESERVE_FRACTION))
    if config_max_tokens_cap is not None:
        reserve = min(reserve, config_max_tokens_cap)
    return max(0, reserve)


def safety_margin(context_window: int) -> int:
    """1000 tokens (Amplifier's margin), scaled to 2% of windows under 50K (8K -> 164)."""
    return min(DEFAULT_SAFETY_MARGIN, math.ceil(context_window * 0.02))


def budget_for(
    context_window: int,
    max_output_tokens: int | None = None,
    *,
    request_max_tokens: int | None = None,
    config_max_tokens_cap: int | None = None,
    margin: int | None = None,
    system_reserve: int = 0,
) -> Budget:
    """A :class:`Budget` from model limits with the reserve and margin policies applied."""
    return Budget(
        context_window=context_window,
        output_reserve=output_reserve(
            context_window, max_output_tokens, request_max_tokens, config_max_tokens_cap
        ),
        safety_margin=safety_margin(context_window) if margin is None else margin,
        system_reserve=system_reserve,
    )


def provider_limits(provider: Any) -> tuple[int | None, int | None]:
    """``(context_window, max_output_tokens)`` from ``provider.get_info().defaults``.

    Amplifier providers expose ``defaults`` as a dict; attribute objects work too.
    Anything missing or unusable is ``None``; a provider without ``get_info`` or
    whose ``get_info`` fails yields ``(None, None)``.
    """
    get_info = getattr(provider, "get_info", None)
    if not callable(get_info):
        return None, None
    try:
        info = get_info()
    except Exception:
        return None, None
    if inspect.iscoroutine(info):  # an async get_info cannot be awaited from pure code
        info.close()
        return None, None
    defaults = (
        info.get("defaults") if isinstance(info, Mapping) else getattr(info, "defaults", None)
    )
    if defaults is None:
        return None, None

    def read(key: str) -> int | None:
        if isinstance(defaults, Mapping):
            return positive_int(defaults.get(key))
        return positive_int(getattr(defaults, key, None))

    return read("context_window"), read("max_output_tokens")


def budget_from_provider(
    provider: Any,
    *,
    fallback_context_window: int | None = None,
    fallback_max_output_tokens: int | None = None,
    request_max_tokens: int | None = None,
    config_max_tokens_cap: int | None = None,
    system_reserve: int = 0,
) -> Budget | None:
    """Budget per the Amplifier contract (window - max output - safety margin).

    The provider's advertised values win over the fallbacks (typically
    :func:`contextledger.core.model_limits.model_limits`). The max output goes through
    :func:`output_reserve`'s policy. ``None`` when no context window is known at all.
    """
    window, max_output = provider_limits(provider)
    window = window or fallback_context_window
    if window is None:
        return None
    return budget_for(
        window,
        max_output if max_output is not None else fallback_max_output_tokens,
        request_max_tokens=request_max_tokens,
        config_max_tokens_cap=config_max_tokens_cap,
        system_reserve=system_reserve,
    )


# --- thresholds and states ------------------------------------------------------------


class Pressure(StrEnum):
    """How full the context is against its budget: healthy, warning, critical, overflow."""

    HEALTHY = "healthy"
    WARNING = "warning"
    CRITICAL = "critical"
    OVERFLOW = "overflow"


@dataclass(frozen=True, slots=True)
class PressureThresholds:
    """Usage fractions at which the state rises; each boundary is inclusive."""

    warning: float
    critical: float
    overflow: float
    name: str = "custom"

    def __post_init__(self) -> None:
        if not 0 < self.warning < self.critical < self.overflow <= 1:
            raise ConfigError(
                "thresholds must satisfy 0 < warning < critical < overflow <= 1, got "
                f"{self.warning}/{self.critical}/{self.overflow}",
                key="thresholds",
            )


PROFILES: Mapping[str, PressureThresholds] = {
    "conservative": PressureThresholds(0.70, 0.80, 0.90, "conservative"),
    "balanced": PressureThresholds(0.75, 0.85, 0.95, "balanced"),
    "aggressive": PressureThresholds(0.85, 0.92, 0.97, "aggressive"),
}
GEMINI_THRESHOLDS = PressureThresholds(0.88, 0.94, 0.98, "gemini")


def thresholds_for(
    model: str | None, profile: str | PressureThresholds | None = None
) -> PressureThresholds:
    """An explicit ``profile`` wins; else the model's default.

    Defaults (families from ``core/providers``): Gemini 0.88/0.94/0.98
    (1M windows: late compaction is cheap
    headroom), DeepSeek aggressive, ``*opus*`` conservative (expensive tokens,
    compaction earlier), everything else balanced.
    """
    if isinstance(profile, PressureThresholds):
        return profile
    if profile is not None:
        found = PROFILES.get(profile.strip().lower())
        if found is None:
            raise ConfigError(
                f"unknown threshold profile {profile!r}; use one of {sorted(PROFILES)}",
                key="profile",
            )
        return found
    family = model_family(model)
    if family == "gemini":
        return GEMINI_THRESHOLDS
    if family == "deepseek":
        return PROFILES["aggressive"]
    if "opus" in bare_model_name(model):
        return PROFILES["conservative"]
    return PROFILES["balanced"]


def state_for(fraction: float, thresholds: PressureThresholds) -> Pressure:
    """Pressure for a usage fraction; ``fraction >= threshold`` is the higher state."""
    if fraction >= thresholds.overflow:
        return Pressure.OVERFLOW
    if fraction >= thresholds.critical:
        return Pressure.CRITICAL
    if fraction >= thresholds.warning:
        return Pressure.WARNING
    return Pressure.HEALTHY


@dataclass(frozen=True, slots=True)
class Usage:
    """``tokens`` out of ``budget`` available tokens; ``fraction`` may exceed 1."""

    tokens: int
    budget: int
    fraction: float
    state: Pressure


def usage(tokens: int, budget: Budget | int, thresholds: PressureThresholds) -> Usage:
    """How full the budget is. ``budget`` is a :class:`Budget` or its ``available``."""
    available = budget.available if isinstance(budget, Budget) else budget
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0:
        raise InvalidArgument(f"tokens must be an int >= 0, got {tokens!r}", field="tokens")
    if isinstance(available, bool) or not isinstance(available, int) or available <= 0:
        raise CompactionError(
            f"no token budget: available = {available!r}",
            code="NO_TOKEN_BUDGET",
            available=available,
        )
    fraction = tokens / available
    return Usage(tokens, available, fraction, state_for(fraction, thresholds))


def session_limits(
    config: ContextConfig, session_model: str | None, model: str | None
) -> ModelLimits:
    """Context window and output limit for ``model`` (default: the session's model).

    A configured ``context_window`` wins for the session's own model; with no model at
    all, the configured window or ``max_tokens`` (else 8192) is assumed.
    """
    name = model or session_model
    if config.context_window and not model:
        return ModelLimits(config.context_window, config.max_output_tokens, "config")
    if not name:
        return ModelLimits(
            config.context_window or config.max_tokens or 8192, config.max_output_tokens, "default"
        )
    return model_limits(name, config.model_overrides or None)


def resolve_budget(
    config: ContextConfig,
    session_model: str | None,
    *,
    token_budget: int | None = None,
    provider: Any | None = None,
    model: str | None = None,
    max_tokens: int | None = None,
) -> Budget:
    """The budget in force: explicit ``token_budget``, else the provider's, else the model's.

    ``max_tokens`` is the request's output allowance; ``config.max_tokens`` caps the
    context itself (as Amplifier's ``max_tokens`` does).
    """
    if token_budget is not None:
        if isinstance(token_budget, bool) or not isinstance(token_budget, int) or token_budget <= 0:
            raise InvalidArgument("token_budget must be a positive int", field="token_budget")
        cap = min(token_budget, config.max_tokens) if config.max_tokens else token_budget
        return Budget(context_window=cap, output_reserve=0, safety_margin=0)
    if (
        not (model or session_model or config.context_window)
        and provider is None
        and (config.max_tokens)
    ):
        # No model to take limits from: the configured cap is the budget.
        return Budget(context_window=config.max_tokens, output_reserve=0, safety_margin=0)
    limits = session_limits(config, session_model, model)
    found = (
        budget_from_provider(
            provider,
            fallback_context_window=limits.context_window,
            fallback_max_output_tokens=limits.max_output_tokens,
            request_max_tokens=max_tokens,
            config_max_tokens_cap=config.max_output_tokens,
        )
        if provider is not None
        else None
    )
    result = found or budget_for(
        limits.context_window,
        limits.max_output_tokens,
        request_max_tokens=max_tokens,
        config_max_tokens_cap=config.max_output_tokens,
        margin=config.safety_margin,
    )
    if config.max_tokens and config.max_tokens < result.available:
        return Budget(context_window=config.max_tokens, output_reserve=0, safety_margin=0)
    return result
