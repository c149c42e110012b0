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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import MISSING, dataclass, field, fields
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


# --------------------------------------------------------------------------- declaring

#: A field's check: ``(dotted key, raw value) -> the value to hold``, raising
#: ``ConfigError`` naming the key.
Check = Callable[[str, Any], Any]
_ABSENT = object()


def setting(
    default: Any = MISSING,
    *,
    check: Check,
    help: str,
    default_factory: Callable[[], Any] | Any = MISSING,
    absent: Any = _ABSENT,
    secret: bool = False,
) -> Any:
    """A config field declared once: its default, its check and its help (for the docs'
    table, ``describe_fields``). ``absent`` is what the check gets when the key is
    missing (default: the field's default); ``secret`` values are redacted in
    ``to_dict`` and never recorded."""
    metadata = {"check": check, "help": help, "absent": absent, "secret": secret}
    if default_factory is not MISSING:
        return field(default_factory=default_factory, metadata=metadata, repr=not secret)
    return field(default=default, metadata=metadata, repr=not secret)


def integer(minimum: int, *, optional: bool = False) -> Check:
    return lambda key, value: _int(key, value, minimum=minimum, optional=optional)


def bounded(test: Callable[[float], bool], text: str) -> Check:
    """A finite number passing ``test``; ``text`` says the range (``in (0, 1]``)."""

    def check(key: str, value: Any) -> float:
        result = _float(key, value)
        if not test(result):
            raise ConfigError(f"{key} must be {text}, got {result}", key=key)
        return result

    return check


def flag() -> Check:
    return _bool


def text(*, optional: bool = False) -> Check:
    return lambda key, value: _str(key, value, optional=optional)


def one_of(choices: Sequence[str], *, optional: bool = False) -> Check:
    return lambda key, value: _choice(key, value, choices, optional=optional)


def _checked(cls: type, mapping: Mapping[str, Any], prefix: str) -> dict[str, Any]:
    """Every declared field of ``cls`` read from ``mapping`` through its check."""
    values: dict[str, Any] = {}
    defaults = cls()
    for f in fields(cls):
        check = f.metadata.get("check")
        if check is None:
            continue
        if f.name in mapping:
            raw = mapping[f.name]
        elif f.metadata["absent"] is not _ABSENT:
            raw = f.metadata["absent"]
        else:
            raw = getattr(defaults, f.name)
        values[f.name] = check(prefix + f.name, raw)
    return values


def _as_dict(obj: Any, *, redact: bool) -> dict[str, Any]:
    """The plain form of a config object, field by field (nested configs as theirs)."""
    out: dict[str, Any] = {}
    for f in fields(obj):
        value = getattr(obj, f.name)
        if f.metadata.get("secret"):
            out[f.name] = REDACTED if redact and value is not None else value
        elif hasattr(value, "to_dict"):
            out[f.name] = value.to_dict(redact=redact)
        elif isinstance(value, tuple) and all(hasattr(v, "to_dict") for v in value) and value:
            out[f.name] = [v.to_dict(redact=redact) for v in value]
        else:
            out[f.name] = _thaw(value, redact=redact)
    return out


def _names(cls: type) -> frozenset[str]:
    return frozenset(f.name for f in fields(cls))


def describe_fields() -> list[dict[str, Any]]:
    """Every config key, for the docs' table: ``{key, type, default, help}`` rows, nested
    keys dotted (``summarizer.max_summary_tokens``, ``summarizer.models[].timeout``)."""
    literal = {
        "Strategy": " | ".join(STRATEGIES),
        "Profile": " | ".join(PROFILES),
        "SummaryRole": " | ".join(SUMMARY_ROLES),
    }
    rows: list[dict[str, Any]] = []

    def walk(cls: type, prefix: str) -> None:
        defaults = cls() if cls is not SummarizerModel else None
        for f in fields(cls):
            nested = {"summarizer": SummarizerConfig, "recall": RecallConfig}.get(f.name)
            if nested is not None and cls is ContextConfig:
                walk(nested, f"{f.name}.")
                continue
            if f.name == "models" and cls is SummarizerConfig:
                walk(SummarizerModel, f"{prefix}models[].")
                continue
            if f.default is not MISSING:
                default = f.default
            elif defaults is not None:
                default = _thaw(getattr(defaults, f.name), redact=True)
            else:
                default = None
            kind = str(f.type)
            for alias, choices in literal.items():
                kind = kind.replace(alias, choices)
            rows.append(
                {
                    "key": prefix + f.name,
                    "type": kind,
                    "default": _thaw(default, redact=True),
                    "help": f.metadata.get("help", ""),
                }
            )

    walk(ContextConfig, "")
    return rows


# --------------------------------------------------------------------------- summarizer


def _timeout(key: str, value: Any) -> float:
    timeout = _float(key, value)
    if timeout <= 0:
        raise ConfigError(f"{key} must be > 0, got {timeout}", key=key)
    return timeout


@dataclass(frozen=True, slots=True)
class SummarizerModel:
    """One model of the summarizer's fallback chain (tried in order)."""

    model: str = setting(check=text(), help="A litellm model name (required).")
    api_base: str | None = setting(
        None, check=text(optional=True), help="The model's endpoint, when not the provider's."
    )
    api_key: str | None = setting(
        None,
        check=text(optional=True),
        secret=True,
        help="Its API key: kept in the process, recorded redacted.",
    )
    timeout: float = setting(30.0, check=_timeout, help="Seconds a summary call may take.")
    num_retries: int = setting(1, check=integer(0), help="Retries of a failed call.")

    KEYS: ClassVar[frozenset[str]]

    @classmethod
    def from_mapping(cls, raw: object, *, key: str) -> SummarizerModel:
        if isinstance(raw, str):  # shorthand: just a model name
            raw = {"model": raw}
        mapping = _mapping(key, raw)
        _unknown(f"{key}.", mapping, cls.KEYS)
        if "model" not in mapping:
            raise ConfigError(f"{key}.model is required", key=f"{key}.model")
        return cls(**_checked_model(mapping, f"{key}."))

    def to_dict(self, *, redact: bool = True) -> dict[str, Any]:
        return _as_dict(self, redact=redact)


def _checked_model(mapping: Mapping[str, Any], prefix: str) -> dict[str, Any]:
    # SummarizerModel has no default model, so no default instance to read absent keys from
    values: dict[str, Any] = {}
    for f in fields(SummarizerModel):
        raw = mapping.get(f.name, None if f.default is MISSING else f.default)
        values[f.name] = f.metadata["check"](prefix + f.name, raw)
    return values


SummarizerModel.KEYS = _names(SummarizerModel)


def _models(key: str, raw: Any) -> tuple[SummarizerModel, ...]:
    if raw is None:
        raw = []
    if isinstance(raw, str | Mapping) or not isinstance(raw, Sequence):
        raise ConfigError(f"{key} must be a list, got {raw!r}", key=key)
    return tuple(SummarizerModel.from_mapping(m, key=f"{key}[{i}]") for i, m in enumerate(raw))


@dataclass(frozen=True, slots=True)
class SummarizerConfig:
    """How rolling summaries are made; see ``compaction.select`` for what gets folded."""

    models: tuple[SummarizerModel, ...] = setting(
        (),
        check=_models,
        help="The fallback chain of models (litellm specs, or just names), tried in order; "
        "none: the offline summary.",
    )
    max_summary_tokens: int = setting(1024, check=integer(1), help="Longest summary, in tokens.")
    preserve_recent_turns: int = setting(
        5, check=integer(0), help="Turns at the end never folded into a summary."
    )
    preserve_tokens: int | None = setting(
        None,
        check=integer(0, optional=True),
        help="Tokens at the end never folded (instead of counting turns).",
    )
    min_messages: int = setting(4, check=integer(1), help="Fewest messages worth a summary.")
    prompt: str | None = setting(
        None, check=text(optional=True), help="The summary prompt (default: the built-in one)."
    )
    offline_fallback: bool = setting(
        True, check=flag(), help="When every model fails, summarize offline instead of failing."
    )
    summary_role: SummaryRole = setting(
        "user", check=one_of(SUMMARY_ROLES), help="The role the summary message takes."
    )
    summary_position: Literal["in_place"] = setting(
        "in_place",
        check=one_of(SUMMARY_POSITIONS),
        help="Where the summary goes: in place of the turns it folds (the prefix stays put).",
    )

    KEYS: ClassVar[frozenset[str]]

    @classmethod
    def from_mapping(cls, raw: object, *, key: str = "summarizer") -> SummarizerConfig:
        mapping = _mapping(key, {} if raw is None else raw)
        _unknown(f"{key}.", mapping, cls.KEYS)
        return cls(**_checked(cls, mapping, f"{key}."))

    def to_dict(self, *, redact: bool = True) -> dict[str, Any]:
        return _as_dict(self, redact=redact)


SummarizerConfig.KEYS = _names(SummarizerConfig)

RECALL_ENGINES: tuple[str, ...] = ("lexical", "hybrid")
_TS_CONFIG_RE = re.compile(r"^[a-z_][a-z0-9_]*(\.[a-z_][a-z0-9_]*)?$")


def ts_config_name(text_config: str) -> str:
    """A text search configuration's name without its schema (``pg_catalog.english``:
    ``english``): what the stemmer, the stop words and recall's word forms go by."""
    return text_config.rpartition(".")[2]


def _ts_config(key: str, value: Any) -> str:
    name = _str(key, value)
    assert name is not None
    if not _TS_CONFIG_RE.match(name):
        raise ConfigError(
            f"{key} must name a PostgreSQL text search configuration "
            f"(e.g. english, simple), got {name!r}",
            key=key,
        )
    return name


@dataclass(frozen=True, slots=True)
class RecallConfig:
    """Recall of left-out turns into the request (see ``contextledger.recall``).

    ``engine``: ``lexical`` is PostgreSQL full-text search (BM25 in ``memory://``);
    ``hybrid`` adds embeddings (``embedding_model`` through litellm) fused by
    reciprocal rank fusion where the ``vector`` extension exists, lexical elsewhere.
    """

    enabled: bool = setting(True, check=flag(), help="Bring left-out turns back by search.")
    share: float = setting(
        0.15,
        check=bounded(lambda v: 0 < v <= 0.5, "in (0, 0.5]"),
        help="The part of a request's budget the recall block may take.",
    )
    #: The most of a request the block may take when the latest turn asks about the past
    #: (``core.recall.asks_about_past``): the oldest part of the view makes room, and
    #: what the block leaves unused goes back to the view. 0.8: at a tight budget a
    #: question about the past is served by its evidence more than by the newest turns
    #: (``bench/conversations.py`` at 10%: 83% any against 81% at 0.5; the needles 60/60
    #: either way), and at a wide one the block's ``max_matches`` bound it first.
    max_share: float = setting(
        0.8,
        check=_float,
        help="The most it may take when the latest turn asks about the past, in [share, 0.8].",
    )
    engine: Literal["lexical", "hybrid"] = setting(
        "lexical",
        check=one_of(RECALL_ENGINES),
        help="lexical (full-text search) or hybrid (adds embeddings; needs embedding_model).",
    )
    text_search_config: str = setting(
        "english",
        check=_ts_config,
        help="The PostgreSQL text search configuration (the index is built with english).",
    )
    max_matches: int = setting(40, check=integer(1), help="Most candidates a search returns.")
    embedding_model: str | None = setting(
        None, check=text(optional=True), help="A litellm embedding model (hybrid only)."
    )
    embedding_api_base: str | None = setting(
        None, check=text(optional=True), help="The embedding model's endpoint."
    )
    embedding_api_key: str | None = setting(
        None,
        check=text(optional=True),
        secret=True,
        help="Its API key: kept in the process, recorded redacted.",
    )

    KEYS: ClassVar[frozenset[str]]

    @classmethod
    def from_mapping(cls, raw: object, *, key: str = "recall") -> RecallConfig:
        mapping = _mapping(key, {} if raw is None else raw)
        _unknown(f"{key}.", mapping, cls.KEYS)
        values = _checked(cls, mapping, f"{key}.")
        share, max_share = values["share"], values["max_share"]
        if not share <= max_share <= 0.8:
            raise ConfigError(
                f"{key}.max_share must be in [share, 0.8] (share is {share}), got {max_share}",
                key=f"{key}.max_share",
            )
        if values["engine"] == "hybrid" and values["embedding_model"] is None:
            raise ConfigError(
                f"{key}.engine hybrid needs {key}.embedding_model (a litellm model name)",
                key=f"{key}.embedding_model",
            )
        return cls(**values)

    def to_dict(self, *, redact: bool = True) -> dict[str, Any]:
        return _as_dict(self, redact=redact)


RecallConfig.KEYS = _names(RecallConfig)


def _req_int(key: str, value: object, *, minimum: int) -> int:
    result = _int(key, value, minimum=minimum)
    assert result is not None
    return result


def _protected_tools(key: str, value: Any) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, Sequence):
        raise ConfigError(f"{key} must be a list of tool names, got {value!r}", key=key)
    return tuple(_str(f"{key}[{i}]", t) or "" for i, t in enumerate(value))


def _token_counter(key: str, counter: Any) -> str:
    if not isinstance(counter, str) or not (match := _COUNTER_RE.match(counter)):
        raise ConfigError(
            "token_counter must be auto, tiktoken, litellm, chars or chars:<chars per token>, "
            f"got {counter!r}",
            key=key,
        )
    if match[2] is not None:
        ratio: float | None
        try:
            ratio = float(match[2])
        except ValueError:
            ratio = None
        if match[1] != "chars" or ratio is None or not math.isfinite(ratio) or ratio <= 0:
            raise ConfigError(
                f"token_counter ratio must follow 'chars:' and be a number > 0, got {counter!r}",
                key=key,
            )
    return counter


def _overrides(key: str, value: Any) -> Mapping[str, Any]:
    overrides = _mapping(key, {} if value is None else value)
    check_overrides(overrides)
    frozen: Mapping[str, Any] = _freeze(overrides)
    return frozen


# --------------------------------------------------------------------------- context


@dataclass(frozen=True)
class ContextConfig:
    """Everything a context needs to budget and compact; build it with ``from_mapping``.

    ``model_overrides`` is held read-only (a ``MappingProxyType``); ``protected_tools``
    is a tuple. Construct through ``from_mapping``/``merged`` so values are checked.
    """

    max_tokens: int | None = setting(
        None, check=integer(1, optional=True), help="A cap on the context, in tokens."
    )
    compact_threshold: float = setting(
        0.92,
        check=bounded(lambda v: 0 < v <= 1, "in (0, 1]"),
        help="Compact when the view reaches this part of the budget.",
    )
    compact_target: float = setting(
        0.6,
        check=_float,
        help="Compact down to this part of the budget (> 0, below compact_threshold).",
    )
    auto_compact: bool = setting(
        False, check=flag(), help="Compact on append, not only when a request is fitted."
    )
    compaction_strategy: Strategy = setting(
        "truncate", check=one_of(STRATEGIES), help="What compaction drops or folds first."
    )
    preserve_system: bool = setting(True, check=flag(), help="Never compact system messages.")
    keep_recent: int = setting(10, check=integer(1), help="Latest messages always kept.")
    protected_tools: tuple[str, ...] = setting(
        ("skill", "memory_search"),
        check=_protected_tools,
        help="Tools whose results are never pruned.",
    )
    max_tool_output_chars: int = setting(
        10_000, check=integer(100), help="Longer tool outputs are pruned when compacting."
    )
    protect_recent_tool_results: int = setting(
        3, check=integer(0), help="Latest tool results never pruned."
    )
    min_score: float = setting(
        0.3,
        check=bounded(lambda v: 0 <= v <= 1, "in [0, 1]"),
        help="Least importance score kept by the importance strategy.",
    )
    token_counter: str = setting(
        "auto",
        check=_token_counter,
        help="auto | tiktoken | litellm | chars | chars:<chars per token>.",
    )
    profile: Profile | None = setting(
        None,
        check=one_of(PROFILES, optional=True),
        help="A preset of thresholds: conservative | balanced | aggressive.",
    )
    context_window: int | None = setting(
        None,
        check=integer(1, optional=True),
        help="The model's window, when it is not known (or to override it).",
    )
    max_output_tokens: int | None = setting(
        None, check=integer(1, optional=True), help="Tokens kept free for the answer."
    )
    safety_margin: int | None = setting(
        None, check=integer(0, optional=True), help="Tokens kept free beyond the answer."
    )
    model_overrides: Mapping[str, Any] = setting(
        check=_overrides,
        default_factory=lambda: MappingProxyType({}),
        absent=None,
        help="Per model: {name: {context_window, max_output_tokens}}.",
    )
    #: The largest message (its JSON, in bytes) a session accepts; beyond it InvalidMessage.
    max_message_bytes: int = setting(
        4 * 1024 * 1024,
        check=integer(1024),
        help="The largest message (its JSON, in bytes) a session accepts.",
    )
    summarizer: SummarizerConfig = setting(
        check=lambda key, value: SummarizerConfig.from_mapping(value),
        default_factory=SummarizerConfig,
        absent=None,
        help="How summaries are made (the summarizer.* keys).",
    )
    recall: RecallConfig = setting(
        check=lambda key, value: RecallConfig.from_mapping(value),
        default_factory=RecallConfig,
        absent=None,
        help="Recall of left-out turns (the recall.* keys).",
    )

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
        values = _checked(cls, mapping, "")
        threshold, target = values["compact_threshold"], values["compact_target"]
        if not 0 < target < threshold:
            raise ConfigError(
                f"compact_target must be > 0 and below compact_threshold ({threshold}), "
                f"got {target}",
                key="compact_target",
            )
        return cls(**values)

    def _raw(self) -> dict[str, Any]:
        """Unredacted plain form: the input ``merged`` starts from."""
        return _as_dict(self, redact=False)

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
        return _as_dict(self, redact=True)
