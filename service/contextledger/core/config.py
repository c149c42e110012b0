"""The one validated configuration of a context: what to keep, when to compact, how.

A config is recorded in the ledger with every compaction event, so it must be
frozen, comparable and JSON-able (``to_dict``) - and must never leak secrets:
api keys are redacted there (deployment settings such as the DSN are not
session policy and are refused here). Every bad value raises
``ConfigError`` naming the key (dotted for nested keys, e.g.
``summarizer.models[0].timeout``) and what is wrong with it, at load time rather
than in the middle of a compaction.
"""

from __future__ import annotations

import copy
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Any, ClassVar, Literal, TypeVar, get_args

import yaml

from contextledger.core.model_limits import check_overrides
from contextledger.errors import ConfigError

Strategy = Literal["truncate", "priority", "importance", "summarize"]
Profile = Literal["conservative", "balanced", "aggressive"]
SummaryRole = Literal["user", "assistant", "system"]

#: Every compaction strategy a config may name (the one list; rankers are registered
#: under these names in ``core/compaction/strategies.py``).
STRATEGIES: tuple[str, ...] = get_args(Strategy)
PROFILES: tuple[str, ...] = ("conservative", "balanced", "aggressive")
SUMMARY_ROLES: tuple[str, ...] = ("user", "assistant", "system")
#: Only ``in_place`` exists today: a summary takes the place of the turns it folds,
#: so the prefix before it (and the provider's prompt cache) stays put.
SUMMARY_POSITIONS: tuple[str, ...] = ("in_place",)
REDACTED = "***"

_COUNTER_RE = re.compile(r"^(auto|tiktoken|litellm|chars)(?::(.+))?$")
_SECRET_KEYS = frozenset({"api_key", "password", "secret", "token"})

T = TypeVar("T")


# --------------------------------------------------------------------------- checks


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _int(key: str, value: object, *, minimum: int, optional: bool = False) -> int | None:
    if value is None and optional:
        return None
    if not _is_int(value):
        raise ConfigError(f"{key} must be an integer, got {value!r}", key=key)
    assert isinstance(value, int)
    if value < minimum:
        raise ConfigError(f"{key} must be >= {minimum}, got {value}", key=key)
    return value


def _float(key: str, value: object) -> float:
    if not (_is_int(value) or isinstance(value, float)):
        raise ConfigError(f"{key} must be a number, got {value!r}", key=key)
    assert isinstance(value, int | float)
    number = float(value)
    if not math.isfinite(number):
        raise ConfigError(f"{key} must be finite, got {value!r}", key=key)
    return number


def _bool(key: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{key} must be true or false, got {value!r}", key=key)
    return value


def _str(key: str, value: object, *, optional: bool = False) -> str | None:
    if value is None and optional:
        return None
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{key} must be a non-empty string, got {value!r}", key=key)
    return value


def _choice(
    key: str, value: object, choices: Sequence[str], *, optional: bool = False
) -> str | None:
    if value is None and optional:
        return None
    if not isinstance(value, str) or value not in choices:
        allowed = ", ".join(choices) + (" or null" if optional else "")
        raise ConfigError(f"{key} must be one of {allowed}, got {value!r}", key=key)
    return value


def _mapping(key: str, value: object) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ConfigError(f"{key} must be a mapping, got {type(value).__name__}", key=key)
    for k in value:
        if not isinstance(k, str):
            raise ConfigError(f"{key} keys must be strings, got {k!r}", key=key)
    return value


#: A config is policy, not data: its YAML text and its plain form are capped (an alias
#: bomb expands a few hundred bytes of YAML into megabytes).
MAX_CONFIG_BYTES = 64 * 1024
_MAX_CONFIG_DEPTH = 32


def _check_plain(value: object, path: str = "<root>") -> None:
    """The whole config, before any key is read: plain YAML/JSON types only, finite
    numbers, strings without NUL or unpaired surrogates, at most ``MAX_CONFIG_BYTES``
    once serialized (estimated while walking, so a bomb is stopped early)."""
    budget = [MAX_CONFIG_BYTES]

    def spend(n: int, where: str) -> None:
        budget[0] -= n
        if budget[0] < 0:
            raise ConfigError(
                f"configuration is larger than {MAX_CONFIG_BYTES} bytes (at {where})",
                key=where,
            )

    def walk(v: object, where: str, depth: int) -> None:
        if depth > _MAX_CONFIG_DEPTH:
            raise ConfigError(f"{where}: nested deeper than {_MAX_CONFIG_DEPTH} levels", key=where)
        if v is None or isinstance(v, bool):
            spend(5, where)
        elif isinstance(v, int):
            if abs(v) >= 2**63:
                raise ConfigError(f"{where}: integer {v} is too large", key=where)
            spend(len(str(v)), where)
        elif isinstance(v, float):
            if not math.isfinite(v):
                raise ConfigError(f"{where} must be finite, got {v!r}", key=where)
            spend(24, where)
        elif isinstance(v, str):
            spend(len(v) + 2, where)
            _check_config_text(v, where)
        elif isinstance(v, Mapping):
            spend(2, where)
            for k, item in v.items():
                if not isinstance(k, str):
                    raise ConfigError(f"{where} keys must be strings, got {k!r}", key=where)
                _check_config_text(k, where)
                spend(len(k) + 4, where)
                walk(item, k if where == "<root>" else f"{where}.{k}", depth + 1)
        elif isinstance(v, list | tuple):
            spend(2, where)
            for i, item in enumerate(v):
                walk(item, f"{where}[{i}]", depth + 1)
        else:
            raise ConfigError(
                f"{where}: {type(v).__name__} is not a plain YAML/JSON value", key=where
            )

    walk(value, path, 0)


def _check_config_text(text: str, where: str) -> None:
    if "\x00" in text:
        raise ConfigError(f"{where}: contains a NUL character", key=where)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ConfigError(f"{where}: contains an unpaired surrogate", key=where) from None


def _unknown(prefix: str, mapping: Mapping[str, Any], known: frozenset[str]) -> None:
    extra = sorted(set(mapping) - known)
    if extra:
        key = f"{prefix}{extra[0]}"
        raise ConfigError(
            f"unknown configuration key {key!r} (known: {', '.join(sorted(known))})", key=key
        )


#: Where the data goes is the ledger's business, not a session's policy.
DEPLOYMENT_KEYS = ("dsn", "storage_path")


def _refuse_deployment_keys(mapping: Mapping[str, Any]) -> None:
    for key in DEPLOYMENT_KEYS:
        if key in mapping:
            arg = "dsn" if key == "dsn" else "home"
            raise ConfigError(
                f"{key!r} is not a session setting: pass it to Ledger.open({arg}=...) "
                f"(or set {'CONTEXTLEDGER_DSN' if key == 'dsn' else 'CONTEXTLEDGER_HOME'}); "
                "the Amplifier mount takes it as a mount option",
                key=key,
            )


def _freeze(value: Any) -> Any:
    """Deep read-only copy, so a frozen config cannot be changed through a nested dict."""
    if isinstance(value, Mapping):
        return MappingProxyType({k: _freeze(v) for k, v in value.items()})
    if isinstance(value, list | tuple):
        return tuple(_freeze(v) for v in value)
    return copy.deepcopy(value)


def _thaw(value: Any, *, redact: bool) -> Any:
    if isinstance(value, Mapping):
        return {
            k: (
                REDACTED
                if redact and k in _SECRET_KEYS and v is not None
                else _thaw(v, redact=redact)
            )
            for k, v in value.items()
        }
    if isinstance(value, tuple | list):
        return [_thaw(v, redact=redact) for v in value]
    return value


# --------------------------------------------------------------------------- summarizer


@dataclass(frozen=True, slots=True)
class SummarizerModel:
    """One model of the summarizer's fallback chain (tried in order)."""

    model: str
    api_base: str | None = None
    api_key: str | None = field(default=None, repr=False)
    timeout: float = 30.0
    num_retries: int = 1

    KEYS: ClassVar[frozenset[str]] = frozenset(
        {"model", "api_base", "api_key", "timeout", "num_retries"}
    )

    @classmethod
    def from_mapping(cls, raw: object, *, key: str) -> SummarizerModel:
        if isinstance(raw, str):  # shorthand: just a model name
            raw = {"model": raw}
        mapping = _mapping(key, raw)
        _unknown(f"{key}.", mapping, cls.KEYS)
        if "model" not in mapping:
            raise ConfigError(f"{key}.model is required", key=f"{key}.model")
        model = _str(f"{key}.model", mapping["model"])
        assert model is not None
        timeout = _float(f"{key}.timeout", mapping.get("timeout", 30.0))
        if timeout <= 0:
            raise ConfigError(f"{key}.timeout must be > 0, got {timeout}", key=f"{key}.timeout")
        retries = _int(f"{key}.num_retries", mapping.get("num_retries", 1), minimum=0)
        assert retries is not None
        return cls(
            model=model,
            api_base=_str(f"{key}.api_base", mapping.get("api_base"), optional=True),
            api_key=_str(f"{key}.api_key", mapping.get("api_key"), optional=True),
            timeout=timeout,
            num_retries=retries,
        )

    def to_dict(self, *, redact: bool = True) -> dict[str, Any]:
        key = REDACTED if redact and self.api_key is not None else self.api_key
        return {
            "model": self.model,
            "api_base": self.api_base,
            "api_key": key,
            "timeout": self.timeout,
            "num_retries": self.num_retries,
        }


@dataclass(frozen=True, slots=True)
class SummarizerConfig:
    """How rolling summaries are made; see ``compaction.select`` for what gets folded."""

    models: tuple[SummarizerModel, ...] = ()
    max_summary_tokens: int = 1024
    preserve_recent_turns: int = 5
    preserve_tokens: int | None = None
    min_messages: int = 4
    prompt: str | None = None
    offline_fallback: bool = True
    summary_role: SummaryRole = "user"
    summary_position: Literal["in_place"] = "in_place"

    KEYS: ClassVar[frozenset[str]] = frozenset(
        {
            "models",
            "max_summary_tokens",
            "preserve_recent_turns",
            "preserve_tokens",
            "min_messages",
            "prompt",
            "offline_fallback",
            "summary_role",
            "summary_position",
        }
    )

    @classmethod
    def from_mapping(cls, raw: object, *, key: str = "summarizer") -> SummarizerConfig:
        mapping = _mapping(key, {} if raw is None else raw)
        _unknown(f"{key}.", mapping, cls.KEYS)
        models_raw = mapping.get("models", [])
        if models_raw is None:
            models_raw = []
        if isinstance(models_raw, str | Mapping) or not isinstance(models_raw, Sequence):
            raise ConfigError(
                f"{key}.models must be a list, got {models_raw!r}", key=f"{key}.models"
            )
        models = tuple(
            SummarizerModel.from_mapping(m, key=f"{key}.models[{i}]")
            for i, m in enumerate(models_raw)
        )
        d = cls()
        return cls(
            models=models,
            max_summary_tokens=_req_int(
                f"{key}.max_summary_tokens",
                mapping.get("max_summary_tokens", d.max_summary_tokens),
                minimum=1,
            ),
            preserve_recent_turns=_req_int(
                f"{key}.preserve_recent_turns",
                mapping.get("preserve_recent_turns", d.preserve_recent_turns),
                minimum=0,
            ),
            preserve_tokens=_int(
                f"{key}.preserve_tokens", mapping.get("preserve_tokens"), minimum=0, optional=True
            ),
            min_messages=_req_int(
                f"{key}.min_messages", mapping.get("min_messages", d.min_messages), minimum=1
            ),
            prompt=_str(f"{key}.prompt", mapping.get("prompt"), optional=True),
            offline_fallback=_bool(
                f"{key}.offline_fallback", mapping.get("offline_fallback", d.offline_fallback)
            ),
            summary_role=_choice(  # type: ignore[arg-type]
                f"{key}.summary_role", mapping.get("summary_role", d.summary_role), SUMMARY_ROLES
            ),
            summary_position=_choice(  # type: ignore[arg-type]
                f"{key}.summary_position",
                mapping.get("summary_position", d.summary_position),
                SUMMARY_POSITIONS,
            ),
        )

    def to_dict(self, *, redact: bool = True) -> dict[str, Any]:
        return {
            "models": [m.to_dict(redact=redact) for m in self.models],
            "max_summary_tokens": self.max_summary_tokens,
            "preserve_recent_turns": self.preserve_recent_turns,
            "preserve_tokens": self.preserve_tokens,
            "min_messages": self.min_messages,
            "prompt": self.prompt,
            "offline_fallback": self.offline_fallback,
            "summary_role": self.summary_role,
            "summary_position": self.summary_position,
        }


RECALL_ENGINES: tuple[str, ...] = ("lexical", "hybrid")
_TS_CONFIG_RE = re.compile(r"^[a-z_][a-z0-9_]*(\.[a-z_][a-z0-9_]*)?$")


@dataclass(frozen=True, slots=True)
class RecallConfig:
    """Recall of left-out turns into the request (see ``contextledger.recall``).

    ``engine``: ``lexical`` is PostgreSQL full-text search (BM25 in ``memory://``);
    ``hybrid`` adds embeddings (``embedding_model`` through litellm) fused by
    reciprocal rank fusion where the ``vector`` extension exists, lexical elsewhere.
    """

    enabled: bool = True
    share: float = 0.15
    #: The most of a request the block may take when the latest turn asks about the past
    #: (``core.recall.asks_about_past``): the oldest part of the view makes room, and
    #: what the block leaves unused goes back to the view.
    max_share: float = 0.5
    engine: Literal["lexical", "hybrid"] = "lexical"
    text_search_config: str = "english"
    max_matches: int = 40
    embedding_model: str | None = None
    embedding_api_base: str | None = None
    embedding_api_key: str | None = field(default=None, repr=False)

    KEYS: ClassVar[frozenset[str]] = frozenset(
        {
            "enabled",
            "share",
            "max_share",
            "engine",
            "text_search_config",
            "max_matches",
            "embedding_model",
            "embedding_api_base",
            "embedding_api_key",
        }
    )

    @classmethod
    def from_mapping(cls, raw: object, *, key: str = "recall") -> RecallConfig:
        mapping = _mapping(key, {} if raw is None else raw)
        _unknown(f"{key}.", mapping, cls.KEYS)
        d = cls()
        share = _float(f"{key}.share", mapping.get("share", d.share))
        if not 0 < share <= 0.5:
            raise ConfigError(f"{key}.share must be in (0, 0.5], got {share}", key=f"{key}.share")
        max_share = _float(f"{key}.max_share", mapping.get("max_share", max(share, d.max_share)))
        if not share <= max_share <= 0.8:
            raise ConfigError(
                f"{key}.max_share must be in [share, 0.8] (share is {share}), got {max_share}",
                key=f"{key}.max_share",
            )
        ts_config = _str(
            f"{key}.text_search_config", mapping.get("text_search_config", d.text_search_config)
        )
        assert ts_config is not None
        if not _TS_CONFIG_RE.match(ts_config):
            raise ConfigError(
                f"{key}.text_search_config must name a PostgreSQL text search configuration "
                f"(e.g. english, simple), got {ts_config!r}",
                key=f"{key}.text_search_config",
            )
        engine = _choice(f"{key}.engine", mapping.get("engine", d.engine), RECALL_ENGINES)
        model = _str(f"{key}.embedding_model", mapping.get("embedding_model"), optional=True)
        if engine == "hybrid" and model is None:
            raise ConfigError(
                f"{key}.engine hybrid needs {key}.embedding_model (a litellm model name)",
                key=f"{key}.embedding_model",
            )
        return cls(
            enabled=_bool(f"{key}.enabled", mapping.get("enabled", d.enabled)),
            share=share,
            max_share=max_share,
            engine=engine,  # type: ignore[arg-type]
            text_search_config=ts_config,
            max_matches=_req_int(
                f"{key}.max_matches", mapping.get("max_matches", d.max_matches), minimum=1
            ),
            embedding_model=model,
            embedding_api_base=_str(
                f"{key}.embedding_api_base", mapping.get("embedding_api_base"), optional=True
            ),
            embedding_api_key=_str(
                f"{key}.embedding_api_key", mapping.get("embedding_api_key"), optional=True
            ),
        )

    def to_dict(self, *, redact: bool = True) -> dict[str, Any]:
        key = self.embedding_api_key
        return {
            "enabled": self.enabled,
            "share": self.share,
            "max_share": self.max_share,
            "engine": self.engine,
            "text_search_config": self.text_search_config,
            "max_matches": self.max_matches,
            "embedding_model": self.embedding_model,
            "embedding_api_base": self.embedding_api_base,
            "embedding_api_key": REDACTED if redact and key is not None else key,
        }


def _req_int(key: str, value: object, *, minimum: int) -> int:
    result = _int(key, value, minimum=minimum)
    assert result is not None
    return result


# --------------------------------------------------------------------------- context


@dataclass(frozen=True)
class ContextConfig:
    """Everything a context needs to budget and compact; build it with ``from_mapping``.

    ``model_overrides`` is held read-only (a ``MappingProxyType``); ``protected_tools``
    is a tuple. Construct through ``from_mapping``/``merged`` so values are checked.
    """

    max_tokens: int | None = None
    compact_threshold: float = 0.92
    compact_target: float = 0.6
    auto_compact: bool = False
    compaction_strategy: Strategy = "truncate"
    preserve_system: bool = True
    keep_recent: int = 10
    protected_tools: tuple[str, ...] = ("skill", "memory_search")
    max_tool_output_chars: int = 10_000
    protect_recent_tool_results: int = 3
    min_score: float = 0.3
    token_counter: str = "auto"
    profile: Profile | None = None
    context_window: int | None = None
    max_output_tokens: int | None = None
    safety_margin: int | None = None
    model_overrides: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    #: The largest message (its JSON, in bytes) a session accepts; beyond it InvalidMessage.
    max_message_bytes: int = 4 * 1024 * 1024
    summarizer: SummarizerConfig = field(default_factory=SummarizerConfig)
    recall: RecallConfig = field(default_factory=RecallConfig)

    @classmethod
    def keys(cls) -> frozenset[str]:
        return frozenset(f.name for f in fields(cls))

    @staticmethod
    def parse_text(text: str) -> Any:
        """YAML (or JSON) text to plain values; a parse error is a ``ConfigError``
        naming the line. Only plain YAML (``safe_load``: tags are refused); the text
        is capped before parsing and the result checked whole (``_check_plain``)."""
        _check_config_text(text, "<text>")
        if len(text.encode("utf-8")) > MAX_CONFIG_BYTES:
            raise ConfigError(
                f"configuration text is larger than {MAX_CONFIG_BYTES} bytes", key="<root>"
            )
        try:
            value = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
            where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
            problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
            raise ConfigError(
                f"configuration is not valid YAML{where}: {problem}",
                key="<root>",
                line=mark.line + 1 if mark else None,
            ) from exc
        except (ValueError, RecursionError) as exc:  # e.g. an out-of-range timestamp
            raise ConfigError(f"configuration is not valid YAML: {exc}", key="<root>") from exc
        _check_plain(value)
        return value

    @classmethod
    def from_recorded(cls, raw: Mapping[str, Any]) -> ContextConfig:
        """A config read back from the ledger. Configs recorded before ``dsn`` and
        ``storage_path`` left the session config may carry them: they are dropped."""
        return cls.from_mapping({k: v for k, v in raw.items() if k not in DEPLOYMENT_KEYS})

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any] | str | None = None) -> ContextConfig:
        """Validate a mapping (or YAML text) into a config; unknown keys are errors."""
        if isinstance(raw, str):
            raw = cls.parse_text(raw)
        if raw is None:
            raw = {}
        _check_plain(raw)
        mapping = _mapping("<root>", raw)
        _refuse_deployment_keys(mapping)
        _unknown("", mapping, cls.keys())
        d = cls()

        def get(key: str, default: T) -> Any:
            return mapping.get(key, default)

        threshold = _float("compact_threshold", get("compact_threshold", d.compact_threshold))
        if not 0 < threshold <= 1:
            raise ConfigError(
                f"compact_threshold must be in (0, 1], got {threshold}", key="compact_threshold"
            )
        target = _float("compact_target", get("compact_target", d.compact_target))
        if not 0 < target < threshold:
            raise ConfigError(
                f"compact_target must be > 0 and below compact_threshold ({threshold}), "
                f"got {target}",
                key="compact_target",
            )
        min_score = _float("min_score", get("min_score", d.min_score))
        if not 0 <= min_score <= 1:
            raise ConfigError(f"min_score must be in [0, 1], got {min_score}", key="min_score")

        tools_raw = get("protected_tools", list(d.protected_tools))
        if isinstance(tools_raw, str) or not isinstance(tools_raw, Sequence):
            raise ConfigError(
                f"protected_tools must be a list of tool names, got {tools_raw!r}",
                key="protected_tools",
            )
        tools = tuple(_str(f"protected_tools[{i}]", t) or "" for i, t in enumerate(tools_raw))

        counter = get("token_counter", d.token_counter)
        if not isinstance(counter, str) or not (match := _COUNTER_RE.match(counter)):
            raise ConfigError(
                "token_counter must be auto, tiktoken, litellm, chars or chars:<chars per token>, "
                f"got {counter!r}",
                key="token_counter",
            )
        if match[2] is not None:
            ratio: float | None
            try:
                ratio = float(match[2])
            except ValueError:
                ratio = None
            if match[1] != "chars" or ratio is None or not math.isfinite(ratio) or ratio <= 0:
                raise ConfigError(
                    "token_counter ratio must follow 'chars:' and be a number > 0, "
                    f"got {counter!r}",
                    key="token_counter",
                )

        raw_overrides = get("model_overrides", None)
        overrides = _mapping("model_overrides", {} if raw_overrides is None else raw_overrides)
        check_overrides(overrides)
        summarizer = SummarizerConfig.from_mapping(get("summarizer", None))

        return cls(
            max_tokens=_int("max_tokens", get("max_tokens", None), minimum=1, optional=True),
            compact_threshold=threshold,
            compact_target=target,
            auto_compact=_bool("auto_compact", get("auto_compact", d.auto_compact)),
            compaction_strategy=_choice(  # type: ignore[arg-type]
                "compaction_strategy", get("compaction_strategy", d.compaction_strategy), STRATEGIES
            ),
            preserve_system=_bool("preserve_system", get("preserve_system", d.preserve_system)),
            keep_recent=_req_int("keep_recent", get("keep_recent", d.keep_recent), minimum=1),
            protected_tools=tools,
            max_tool_output_chars=_req_int(
                "max_tool_output_chars",
                get("max_tool_output_chars", d.max_tool_output_chars),
                minimum=100,
            ),
            protect_recent_tool_results=_req_int(
                "protect_recent_tool_results",
                get("protect_recent_tool_results", d.protect_recent_tool_results),
                minimum=0,
            ),
            min_score=min_score,
            token_counter=counter,
            profile=_choice(  # type: ignore[arg-type]
                "profile", get("profile", None), PROFILES, optional=True
            ),
            context_window=_int(
                "context_window", get("context_window", None), minimum=1, optional=True
            ),
            max_output_tokens=_int(
                "max_output_tokens", get("max_output_tokens", None), minimum=1, optional=True
            ),
            safety_margin=_int(
                "safety_margin", get("safety_margin", None), minimum=0, optional=True
            ),
            model_overrides=_freeze(overrides),
            max_message_bytes=_req_int(
                "max_message_bytes",
                get("max_message_bytes", d.max_message_bytes),
                minimum=1024,
            ),
            summarizer=summarizer,
            recall=RecallConfig.from_mapping(get("recall", None)),
        )

    def _raw(self) -> dict[str, Any]:
        """Unredacted plain form: the input ``merged`` starts from."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "summarizer":
                out[f.name] = self.summarizer.to_dict(redact=False)
            elif f.name == "recall":
                out[f.name] = self.recall.to_dict(redact=False)
            else:
                out[f.name] = _thaw(value, redact=False)
        return out

    def merged(self, overrides: Mapping[str, Any] | str | None) -> ContextConfig:
        """A new config with ``overrides`` applied and validated again.

        Top-level keys replace; ``summarizer``, ``recall`` and ``model_overrides`` merge one level
        deep (so overriding ``summarizer.min_messages`` keeps the configured models;
        a given ``summarizer.models`` list replaces the whole chain).
        """
        if isinstance(overrides, str):
            overrides = self.parse_text(overrides)
        _check_plain(overrides, "<overrides>")
        changes = _mapping("<overrides>", overrides or {})
        _refuse_deployment_keys(changes)
        _unknown("", changes, self.keys())
        base = self._raw()
        for key, value in changes.items():
            if key in ("summarizer", "model_overrides", "recall") and isinstance(value, Mapping):
                base[key] = {**base[key], **value}
            else:
                base[key] = value
        return ContextConfig.from_mapping(base)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form for the ledger; api keys, secrets and DSN passwords are redacted."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "summarizer":
                out[f.name] = self.summarizer.to_dict(redact=True)
            elif f.name == "recall":
                out[f.name] = self.recall.to_dict(redact=True)
            else:
                out[f.name] = _thaw(value, redact=True)
        return out
