"""Model limits: how many tokens a model accepts and how many it may emit.

The source of truth is litellm's *bundled* model map (``max_input_tokens`` is the
context window; ``max_output_tokens`` the output limit: litellm's ``get_max_tokens``
returns the output limit, so it is never used for the window). The shell reads the map
file itself for the names it can answer by litellm's rules, and imports litellm lazily,
offline-configured, for the rest (:mod:`contextledger.core.catalogue`).

Resolution order for ``model_limits(model, overrides)``:

1. ``overrides`` (user config) for any spelling of the name (see :func:`name_candidates`);
2. litellm's map for each spelling, most specific first;
3. :data:`BUILTIN_LIMITS`, for models the bundled map lacks;
4. the default window (8192) and one structlog warning per model name.

Never a network call: for providers whose litellm ``get_model_info`` asks a live
server (ollama's ``/api/show``, vLLM, lemonade, Hugging Face, the litellm proxy)
only the static map rows are read, and providers litellm authenticates with to infer
them (``github_copilot``, ``chatgpt``) are taken from the prefix.
"""

from __future__ import annotations

import fnmatch
import logging
import math
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from contextledger.core import catalogue
from contextledger.errors import ConfigError

__all__ = [
    "BUILTIN_LIMITS",
    "DEFAULT_CONTEXT_WINDOW",
    "ModelLimits",
    "bare_model_name",
    "clear_cache",
    "model_limits",
    "name_candidates",
]

log = logging.getLogger(__name__)

DEFAULT_CONTEXT_WINDOW = 8192
"""Window assumed for a model nobody knows: small on purpose, since overestimating
the window makes the provider reject (or silently truncate) the request."""


@dataclass(frozen=True, slots=True)
class ModelLimits:
    """A model's context window and output limit; ``source`` says where they came from.

    ``source`` is ``"override"``, ``"litellm:<map key>"``, ``"builtin:<pattern>"`` or
    ``"default"``. ``max_output_tokens`` is ``None`` when nobody knows it.
    """

    context_window: int
    max_output_tokens: int | None
    source: str


BUILTIN_LIMITS: tuple[tuple[str, int, int], ...] = (
    # (fnmatch pattern on a lower-cased candidate name, context window, max output).
    # Only what litellm 1.106's bundled map lacks (checked: each raises ModelNotMappedError).
    ("claude-3-5-sonnet*", 200_000, 8192),
    ("claude-3.5-sonnet*", 200_000, 8192),
    ("claude-3-7-sonnet*", 200_000, 8192),
    ("claude-3.7-sonnet*", 200_000, 8192),
    ("claude-3-5-haiku*", 200_000, 8192),
    ("claude-3.5-haiku*", 200_000, 8192),
    ("claude-3-opus*", 200_000, 4096),
    ("claude-3-sonnet*", 200_000, 4096),
    ("claude-3-haiku*", 200_000, 4096),
    # Served by Ollama the window is the server's num_ctx, not the model's native
    # 128K; 8192 matches the map's own ``ollama/llama3.1`` row. Overestimating here
    # is the dangerous direction: Ollama truncates the prompt silently.
    ("ollama/llama3*", 8192, 8192),
    ("ollama_chat/llama3*", 8192, 8192),
    # Llama 3.1+ natively: 128K. Plain Llama 3 (no minor version) is 8K.
    ("llama3.[1-9]*", 131_072, 4096),
    ("llama-3.[1-9]*", 131_072, 4096),
    ("meta-llama-3.[1-9]*", 131_072, 4096),
    ("llama3", 8192, 4096),
    ("llama3:*", 8192, 4096),
    ("llama-3-*", 8192, 4096),
)

#: Providers whose litellm ``get_model_info`` queries a live server first (lower case:
#: prefixes are lowered before the look-up); ``contextledger._model_map`` reads it too.
LIVE_LOOKUP_PROVIDERS = frozenset(
    {
        "ollama",
        "ollama_chat",
        "lemonade",
        "huggingface",
        "vllm",
        "hosted_vllm",
        "litellm_proxy",
        "lm_studio",
    }
)

# Providers whose litellm ``get_llm_provider`` runs an OAuth device flow (network) to
# answer (litellm.constants.PROVIDERS_THAT_AUTHENTICATE_ON_PROVIDER_INFO); their
# ``get_model_info`` takes the provider from the prefix instead.
_AUTHENTICATING = frozenset({"github_copilot", "chatgpt"})

_DATE_SUFFIX = re.compile(
    r"(?:[-@_]\d{4}-\d{2}-\d{2}|[-@_]\d{8}|-\d{4}|-latest|@latest|-v\d+:\d+)$",
    re.IGNORECASE,
)

_warned: set[str] = set()
_warned_lock = threading.Lock()


def bare_model_name(model: str | None) -> str:
    """Lower-cased model name without provider prefixes (``openai/``, ``azure/``, ...).

    ``openrouter/anthropic/claude-sonnet-4`` -> ``claude-sonnet-4``. Shared by the
    counters, image maths and threshold defaults so they classify names alike.
    """
    if not model:
        return ""
    return model.strip().rsplit("/", 1)[-1].lower()


def _undated(name: str) -> str:
    """Strip trailing date / ``-latest`` / Bedrock version suffixes, repeatedly."""
    previous = None
    while previous != name:
        previous = name
        name = _DATE_SUFFIX.sub("", name)
    return name


def name_candidates(model: str) -> tuple[str, ...]:
    """Spellings to try for ``model``, most specific first, without duplicates.

    ``azure/gpt-4o-2024-08-06`` -> the name as given, lower-cased, undated
    (``azure/gpt-4o``), Ollama-tag-free, then the same for the bare name
    (``gpt-4o-2024-08-06``, ``gpt-4o``).
    """
    given = model.strip()
    out: list[str] = []

    def add(name: str) -> None:
        if name and name not in out:
            out.append(name)

    for full in (given, given.rsplit("/", 1)[-1]):
        for name in (full, full.lower()):
            add(name)
            add(_undated(name))
            if ":" in name.rsplit("/", 1)[-1]:  # Ollama tag: llama3.1:8b -> llama3.1
                untagged = name.rsplit(":", 1)[0]
                add(untagged)
                add(_undated(untagged))
    return tuple(out)


def positive_int(value: Any) -> int | None:
    """A token count read from data we do not own (litellm's map, a provider's info): the
    whole number of a finite number >= 1, else None. The one reading: NaN, infinities,
    bools, strings and fractions below 1 (``0.5`` would be a window of 0) are all None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return int(value) if value >= 1 else None


def _litellm_lookup(name: str) -> ModelLimits | None:
    """One spelling against litellm's bundled map; ``None`` when unmapped.

    The map file answers first (:func:`catalogue.map_row`: most names, without
    litellm's ~1.5 s import); litellm itself when the file cannot tell. Any litellm
    failure (``ModelNotMappedError``, provider inference errors) is a miss, never an
    exception for the caller.
    """
    row = catalogue.map_row(name)
    if row == "miss":
        return None
    if row is not None:
        return _limits(*row)
    litellm = catalogue.litellm()
    cost_map: Mapping[str, Mapping[str, Any]] = litellm.model_cost
    entry: Mapping[str, Any] | None = None
    key = name
    prefix = name.split("/", 1)[0].lower() if "/" in name else ""
    if prefix in LIVE_LOOKUP_PROVIDERS:
        entry = cost_map.get(name)  # static row only: get_model_info would ask the server
    else:
        if prefix in _AUTHENTICATING:
            provider: str | None = prefix  # get_llm_provider would start an OAuth flow
        else:
            try:
                provider = litellm.get_llm_provider(name)[1]
            except Exception:
                provider = None
        if provider in LIVE_LOOKUP_PROVIDERS:
            entry = cost_map.get(name)
        else:
            try:
                info = litellm.get_model_info(name)
            except Exception:
                return None
            entry = info
            key = str(info.get("key") or name)
    if entry is None:
        return None
    return _limits(entry, key)


def _limits(entry: Mapping[str, Any], key: str) -> ModelLimits | None:
    window = positive_int(entry.get("max_input_tokens"))
    if window is None:
        return None
    return ModelLimits(window, positive_int(entry.get("max_output_tokens")), f"litellm:{key}")


def _builtin_lookup(name: str) -> ModelLimits | None:
    lowered = name.lower()
    for pattern, window, max_output in BUILTIN_LIMITS:
        if fnmatch.fnmatchcase(lowered, pattern):
            return ModelLimits(window, max_output, f"builtin:{pattern}")
    return None


@lru_cache(maxsize=1024)
def _resolve(model: str) -> ModelLimits | None:
    """litellm map first (every spelling), then the builtin table; cached per name."""
    candidates = name_candidates(model)
    for name in candidates:
        found = _litellm_lookup(name)
        if found is not None:
            return found
    for name in candidates:
        found = _builtin_lookup(name)
        if found is not None:
            return found
    return None


def _override_for(
    model: str, overrides: Mapping[str, Mapping[str, Any]] | None
) -> Mapping[str, Any] | None:
    if not overrides:
        return None
    for name in name_candidates(model):
        if name in overrides:
            return overrides[name]
    return None


def _validated(value: Any, key: str, *, optional: bool) -> int | None:
    if value is None and optional:
        return None
    checked = positive_int(value)
    if checked is None or checked != value:
        raise ConfigError(f"{key} must be a positive integer, got {value!r}", key=key)
    return checked


def model_limits(
    model: str,
    overrides: Mapping[str, Mapping[str, Any]] | None = None,
    *,
    default_context_window: int = DEFAULT_CONTEXT_WINDOW,
) -> ModelLimits:
    """Context window and output limit for ``model``.

    ``overrides`` maps a model name to ``{"context_window": int, "max_output_tokens":
    int}``; either key may be omitted, the other value then comes from the map. An
    unknown model gets ``default_context_window`` and a single
    ``model_limits.unknown_model`` warning per name for the process lifetime.
    """
    if not model or not model.strip():
        raise ConfigError("model name is empty", key="model")
    resolved = _resolve(model.strip())
    override = _override_for(model, overrides)
    if override is not None:
        key = f"model_overrides.{model}"
        window = _validated(
            override.get("context_window"), f"{key}.context_window", optional=resolved is not None
        )
        max_output = _validated(
            override.get("max_output_tokens"), f"{key}.max_output_tokens", optional=True
        )
        if window is None:  # only possible when resolved is not None (optional=...)
            assert resolved is not None
            window = resolved.context_window
        if max_output is None and resolved is not None:
            max_output = resolved.max_output_tokens
        return ModelLimits(window, max_output, "override")
    if resolved is not None:
        return resolved
    _validated(default_context_window, "default_context_window", optional=False)
    with _warned_lock:
        first = model not in _warned
        _warned.add(model)
    if first:
        log.warning(
            "unknown model %r: assuming a %d-token context window; set "
            "model_overrides: {%r: {context_window: N}} in the session config "
            "(Ledger.open(config=...) or ledger.session(config=...))",
            model,
            default_context_window,
            model,
            extra={"model": model, "context_window": default_context_window},
        )
    return ModelLimits(default_context_window, None, "default")


def clear_cache() -> None:
    """Forget resolved names and warnings (tests; after changing litellm's map)."""
    _resolve.cache_clear()
    with _warned_lock:
        _warned.clear()


def check_overrides(overrides: Mapping[str, Any]) -> None:
    """``model_overrides`` checked when the config is built, not when first used."""
    for name, entry in overrides.items():
        key = f"model_overrides.{name}"
        if not isinstance(entry, Mapping):
            raise ConfigError(f"{key} must be a mapping, got {entry!r}", key=key)
        for field in ("context_window", "max_output_tokens"):
            if field in entry:
                _validated(entry[field], f"{key}.{field}", optional=True)
