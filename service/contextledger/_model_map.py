"""litellm's bundled model map, read without importing litellm.

A context window costs one look at the map litellm ships
(``model_prices_and_context_window_backup.json``), but asking litellm for it costs its
import: ~1.5 s and millions of objects per process. Most names :mod:`model_limits
<contextledger.core.model_limits>` asks about are a row of that map as written, a
provider's prefix on one, or no row at all; this module answers those from the file
and answers ``None`` ("ask litellm") for everything else.

The rules follow litellm 1.106's ``get_model_info`` (``utils.get_model_info_helper``,
``get_potential_model_names``, ``_check_provider_match``) and ``get_llm_provider``;
``tests/integration/test_model_map.py`` checks every row of the map, the same rows
behind their provider's prefix and a corpus of unknown names against litellm itself,
so a litellm upgrade that changes a rule fails there rather than here, silently.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal

from contextledger.core.model_limits import LIVE_LOOKUP_PROVIDERS

#: A spelling no row answers (litellm would raise ``ModelNotMappedError``).
MISS: Final = "miss"
#: ``(row, key)``: the row litellm's lookup settles on and its key; :data:`MISS`; or
#: ``None`` when this module cannot tell and litellm must be asked.
Answer = tuple[Mapping[str, Any], str] | Literal["miss"] | None

# Prefixes whose get_model_info asks a live server: core reads their static row only.
LIVE: Final = LIVE_LOOKUP_PROVIDERS
# litellm.azure_llms and azure_embedding_models: a name litellm swaps for another first.
_AZURE_ALIASES: Final = frozenset(
    {
        "gpt-35-turbo",
        "gpt-35-turbo-16k",
        "gpt-35-turbo-instruct",
        "azure/gpt-41",
        "azure/gpt-41-mini",
        "azure/gpt-41-nano",
        "ada",
    }
)
# Providers whose names litellm rewrites before the lookup (a region or routing prefix
# dropped, a provider's own cost key) or that authenticate to answer: never decided here.
_REWRITING: Final = frozenset(
    {"bedrock", "bedrock_converse", "bedrock_mantle", "fireworks_ai", "github_copilot", "chatgpt"}
)
# A bare row of these providers is inferred as another (ai21 rows -> ai21_chat), so
# litellm's provider check rejects the row it names.
_RENAMED_BARE: Final = frozenset({"ai21"})
# Provider prefixes read here on a bare row ("openai/gpt-4o" -> gpt-4o): litellm splits
# each off as the provider (get_llm_provider) and takes the bare row of that provider.
PREFIXES: Final = frozenset(
    {"openai", "anthropic", "gemini", "deepseek", "together_ai", "cohere", "cohere_chat"}
)
# Providers whose date or version suffix litellm strips as Vertex's (``-001``).
_VERTEX_STRIP: Final = frozenset({"vertex_ai", "gemini", "databricks"})
_ANTHROPIC_TEXT: Final = frozenset({"claude-2", "claude-instant-1"})  # -> anthropic_text
_BACKFILL_MODES: Final = frozenset({"chat", "responses"})
_LIMITS: Final = ("max_input_tokens", "max_output_tokens")
_DATED: Final = re.compile(r"-\d{4}-\d{2}-\d{2}$")  # utils._strip_dated_snapshot_suffix
_VERSION: Final = re.compile(r"-\d+$")  # utils._strip_stable_vertex_version


@dataclass(frozen=True, slots=True)
class _FillRule:
    pattern: re.Pattern[str]
    providers: frozenset[str]
    info: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class ModelMap:
    """The rows litellm builds ``litellm.model_cost`` from, and its fallback rules."""

    rows: Mapping[str, Mapping[str, Any]]
    lowered: frozenset[str]
    #: routing rules: (pattern, provider), in file order
    routing: tuple[tuple[re.Pattern[str], str], ...]
    #: capability rules: (pattern, model info), in file order
    capability: tuple[tuple[re.Pattern[str], Mapping[str, Any]], ...]
    fill: tuple[_FillRule, ...]
    cohere_chat: frozenset[str]
    mistral: frozenset[str]

    @classmethod
    def parse(cls, raw: Mapping[str, Any]) -> ModelMap:
        """As ``get_model_cost_map._finalize_model_cost_map``: rules out, aliases in."""
        rows: dict[str, Mapping[str, Any]] = {}
        aliases: dict[str, Mapping[str, Any]] = {}
        for key, row in raw.items():
            if key == "fallback_generalizations" or not isinstance(row, Mapping):
                continue
            found = row.get("aliases")
            if found is not None:
                row = {k: v for k, v in row.items() if k != "aliases"}
                for alias in found if isinstance(found, list) else ():
                    if alias not in raw and alias not in aliases:
                        aliases[alias] = row
            rows[key] = row
        rows.update(aliases)
        block = raw.get("fallback_generalizations")
        rules = block.get("rules") if isinstance(block, Mapping) else None
        routing, capability, fill = _rules(rules if isinstance(rules, list) else [])

        def provider_keys(provider: str) -> frozenset[str]:
            return frozenset(k for k, r in rows.items() if r.get("litellm_provider") == provider)

        return cls(
            rows=rows,
            lowered=frozenset(k.lower() for k in rows),
            routing=routing,
            capability=capability,
            fill=fill,
            cohere_chat=provider_keys("cohere_chat"),
            mistral=provider_keys("mistral"),
        )

    def lookup(self, name: str) -> Answer:
        """What litellm's lookup (as model_limits makes it) gives for one spelling."""
        if "/" in name and name.split("/", 1)[0].lower() in LIVE:
            return self._hit(name) if name in self.rows else MISS  # the static row only
        if name in _AZURE_ALIASES:
            return None
        if name in self.rows:
            return self._hit(name) if self._names_itself(name) else None
        if name.lower() in self.lowered:
            return None  # a case-insensitive match: litellm's provider check decides
        prefix, rest = name.split("/", 1) if "/" in name else (None, name)
        row = self.rows.get(rest)
        if (
            prefix in PREFIXES
            and row is not None
            and row.get("litellm_provider") == prefix
            and not (prefix == "anthropic" and rest in _ANTHROPIC_TEXT)
        ):
            return self._hit(rest)  # "openai/gpt-4o": the row gpt-4o
        return self._unmapped(name, prefix, rest)

    def _names_itself(self, key: str) -> bool:
        """Whether litellm's provider check accepts the row a key names: the provider
        litellm infers from the key must be the row's own (``_check_provider_match``)."""
        provider = self.rows[key].get("litellm_provider")
        if "/" not in key:
            return provider not in _RENAMED_BARE and not (
                provider == "anthropic" and key in _ANTHROPIC_TEXT
            )
        # the key itself is the first name litellm looks up (``combined_model_name``),
        # before any rewriting of the part after the prefix
        prefix, rest = key.split("/", 1)
        if prefix == "azure" and (rest in self.cohere_chat or f"mistral/{rest}" in self.mistral):
            return False  # is_non_openai_azure_model: inferred as openai
        if (prefix == "anthropic" and rest in _ANTHROPIC_TEXT) or (
            prefix == "cohere" and rest in self.cohere_chat
        ):
            return False  # inferred as anthropic_text, cohere_chat
        return provider == prefix or (
            prefix == "vertex_ai" and isinstance(provider, str) and provider.startswith(prefix)
        )

    def _hit(self, key: str) -> Answer:
        row = self.rows[key]
        missing = [f for f in _LIMITS if f not in row]
        if missing and row.get("mode", "chat") in _BACKFILL_MODES:
            provider = row.get("litellm_provider", "")
            filled: dict[str, Any] = {}
            for rule in self.fill:  # match_fill_missing_generalizations, later rules win
                if provider in rule.providers and rule.pattern.search(key):
                    filled.update({f: rule.info[f] for f in missing if f in rule.info})
            if filled:
                row = {**filled, **row}
        return row, key

    def _unmapped(self, name: str, prefix: str | None, rest: str) -> Answer:
        """A name no row holds as written: litellm's fallback rules, as
        ``_get_model_info_from_generalization`` applies them (``None``: ask litellm).

        litellm looks up the name, the part after a provider's prefix, and the whole
        name with its date (Vertex: version) suffix stripped, each as written, without a
        prefix put on (``get_potential_model_names``). A row answering any of them is
        left to litellm; otherwise the first that any capability rule matches gets the
        union of their model info, in file order, and none matching is a miss. The
        provider is the prefix when it is a known one (:data:`PREFIXES`), otherwise the
        first routing rule's (the lists get_llm_provider reads before those rules hold
        rows only); a prefix that may or may not be a provider decides nothing that
        depends on it.
        """
        if "ft:" in name or prefix in _REWRITING:
            return None
        known = prefix in PREFIXES or prefix in _VERTEX_STRIP
        routed = None if known else next((p for r, p in self.routing if r.search(name)), None)
        if prefix is not None and routed is not None:
            return None
        provider = prefix if known else routed
        if provider in LIVE or provider in _REWRITING:
            return None
        strip = _VERSION if provider in _VERTEX_STRIP else _DATED
        candidates = tuple(dict.fromkeys((name, rest, strip.sub("", name))))
        if any(c.lower() in self.lowered for c in candidates):
            return None
        for candidate in candidates:
            matched = [info for rule, info in self.capability if rule.search(candidate)]
            if not matched:
                continue
            if candidate == rest != name and not known:
                return None  # tried only if litellm takes the prefix for a provider
            return {k: v for info in matched for k, v in info.items()}, candidate
        return MISS


def _rules(
    rules: list[Any],
) -> tuple[
    tuple[tuple[re.Pattern[str], str], ...],
    tuple[tuple[re.Pattern[str], Mapping[str, Any]], ...],
    tuple[_FillRule, ...],
]:
    """``fallback_generalizations._compile_rule``: routing rules (a provider only) and
    capability rules (anything else; a legacy rule with both acts as both)."""
    named = {
        r["name"]: r["model_info"]
        for r in rules
        if isinstance(r, Mapping)
        and isinstance(r.get("name"), str)
        and isinstance(r.get("model_info"), Mapping)
    }
    routing: list[tuple[re.Pattern[str], str]] = []
    capability: list[tuple[re.Pattern[str], Mapping[str, Any]]] = []
    fill: list[_FillRule] = []
    for rule in rules:
        if not isinstance(rule, Mapping):
            continue
        pattern, info = rule.get("pattern"), rule.get("model_info")
        if not isinstance(pattern, str) or not isinstance(info, Mapping):
            continue
        parent = named.get(rule.get("extends")) if isinstance(rule.get("extends"), str) else None
        if parent is not None:
            info = {**parent, **info}  # the legacy ``extends``, one level
        try:
            compiled = re.compile(pattern, re.IGNORECASE)
        except re.error:
            continue
        providers = rule.get("fill_missing_for_providers", [])
        if not isinstance(providers, list | tuple) or not all(
            isinstance(p, str) for p in providers
        ):
            continue
        if "litellm_provider" in info:
            if not isinstance(info["litellm_provider"], str):
                continue
            routing.append((compiled, info["litellm_provider"]))
            if len(info) == 1:
                continue
        capability.append((compiled, info))
        if providers:
            fill.append(_FillRule(compiled, frozenset(providers), info))
    return tuple(routing), tuple(capability), tuple(fill)


def map_path() -> Path | None:
    """The JSON file litellm loads when ``LITELLM_LOCAL_MODEL_COST_MAP`` is set, found
    without importing litellm."""
    spec = importlib.util.find_spec("litellm")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations)))
    path /= "model_prices_and_context_window_backup.json"
    return path if path.is_file() else None


_lock = threading.Lock()
_loaded: list[ModelMap | None] = []


def bundled() -> ModelMap | None:
    """The bundled map, parsed once per process (~50 ms); ``None`` without litellm."""
    if not _loaded:
        with _lock:
            if not _loaded:
                path = map_path()
                _loaded.append(ModelMap.parse(json.loads(path.read_bytes())) if path else None)
    return _loaded[0]


def answer(name: str) -> Answer:
    """:meth:`ModelMap.lookup` when the bundled file is what litellm would read.

    Not when litellm is already imported (an application may have registered models
    with it: ask it, it is loaded anyway) or the operator chose litellm's remote map.
    """
    if "litellm" in sys.modules:
        return None
    if os.environ.get("LITELLM_LOCAL_MODEL_COST_MAP", "True").lower() != "true":
        return None
    found = bundled()
    return found.lookup(name) if found is not None else None
