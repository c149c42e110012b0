"""Deployment settings of the service, from flags and ``CONTEXTLEDGER_*`` variables.

Per-session policy stays in ``ContextConfig``; these are the process's own knobs.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from contextledger.errors import ConfigError

ENV_PREFIX = "CONTEXTLEDGER_"
LOOPBACK = ("127.0.0.1", "::1", "localhost")


@dataclass(frozen=True, slots=True)
class Fallback:
    """A model the proxy tries when the upstream fails, at its own endpoint: another
    provider needs its own base URL (None: litellm's default for the model's provider)
    and key (None: the provider's own environment variable, as litellm reads it). A
    fallback given by name alone (a plain ``str``) uses the primary's base and key."""

    model: str
    api_base: str | None = None
    api_key: str | None = None


def _knob(default: Any, help_text: str) -> Any:
    """A setting's default and the one line ``contextledger serve --help`` shows for it."""
    return field(default=default, metadata={"help": help_text})


@dataclass(frozen=True)
class Settings:
    """Everything ``create_app`` needs. ``from_env`` reads ``CONTEXTLEDGER_<NAME>``."""

    dsn: str | None = None  # None → the embedded PostgreSQL under ``home``
    home: str | None = None
    host: str = _knob("127.0.0.1", "Bind address (beyond loopback only once an API key exists).")
    port: int = _knob(8765, "Port.")
    workers: int = _knob(
        1, "Service processes sharing the port (each with its own pools; state is in PostgreSQL)."
    )
    #: The database role tenant connections log in as (else switch to from the DSN's
    #: user: ``Tenants``); "" keeps the DSN's own user.
    service_role: str = _knob("contextledger_service", "Database role of tenant connections.")
    service_password: str | None = _knob(
        None, "The service role's password, where the server asks for one."
    )
    pool_size: int = _knob(4, "Database connections per tenant.")
    pgbouncer: bool = _knob(
        False,
        "The DSN reaches PostgreSQL through PgBouncer in transaction mode: asyncpg's "
        "statement cache off, no startup parameters, the service role logs in itself.",
    )
    migrate: bool = _knob(True, "Apply the migrations at start.")
    upstream_api_base: str | None = _knob(
        None, "Where the proxy forwards (an OpenAI-compatible base URL)."
    )
    upstream_api_key: str | None = _knob(None, "The proxy's key for the upstream.")
    #: Client model name → litellm model (default: ``<upstream_provider>/<name>``).
    model_map: Mapping[str, str] = field(
        default_factory=dict, metadata={"help": "JSON object: client model -> litellm model."}
    )
    #: ``hosted_vllm`` speaks plain OpenAI HTTP through litellm's own client; ``openai``
    #: goes through the OpenAI SDK, whose request transform cost ~30 ms per call here
    #: (bench/service.py).
    upstream_provider: str = _knob(
        "hosted_vllm", "litellm provider of an OpenAI-compatible upstream_api_base."
    )
    #: For an OpenAI-compatible upstream (``upstream_api_base`` with a ``hosted_vllm/``
    #: or ``openai/`` model): ~7 ms of CPU less a call (http/upstream.py).
    upstream_relay: bool = _knob(
        True, "Relay OpenAI-compatible requests with our own HTTP client, not litellm."
    )
    #: ``a,b``: each with the primary's base and key; JSON objects: each at its own
    #: endpoint (``Fallback``).
    fallbacks: tuple[str | Fallback, ...] = _knob(
        (),
        "litellm models tried in order when the upstream fails: a,b or JSON "
        '[{"model": …, "api_base": …, "api_key": …}].',
    )
    proxy_parameters: tuple[str, ...] = _knob(
        (),
        "Request fields the proxy forwards besides OpenAI's chat-completion parameters "
        "(a,b; e.g. top_k for vLLM). litellm's control arguments are never forwarded.",
    )
    pass_client_key: bool = _knob(
        False, "Forward the client's own Authorization bearer to the upstream."
    )
    upstream_timeout: float = _knob(600.0, "Seconds to wait for the upstream.")
    upstream_retries: int = _knob(0, "Retries of a failed upstream call.")
    proxy_token_budget: int | None = _knob(
        None, "Token budget of the request views the proxy sends (default: the model's)."
    )
    max_body_bytes: int = _knob(
        16 * 1024 * 1024, "Largest request body accepted (413 beyond), checked before parsing."
    )
    allowed_hosts: tuple[str, ...] = _knob(
        (),
        "Host names served besides the loopback ones when bound to loopback (a,b): "
        "a reverse proxy's name. Anything else is refused (DNS rebinding).",
    )
    config_api_bases: tuple[str, ...] = _knob(
        (),
        "Endpoints a session config posted over HTTP may name (summarizer.models[].api_base, "
        "recall.embedding_api_base); none by default. Keys never come from HTTP.",
    )
    sse_tails_per_tenant: int = _knob(
        16, "Event streams (GET …/events/stream) one tenant may hold open at once (429 beyond)."
    )
    session_cache_bytes: int = _knob(
        512 * 2**20,
        "Memory the process's cache of open sessions may hold (estimated from each cached "
        "session's view: ~24 bytes a token); the least recently used go first.",
    )
    metrics_token: str | None = _knob(
        None,
        "Bearer token /metrics asks for. Without one, /metrics answers only a service bound "
        "to loopback (it names every tenant).",
    )
    #: Tenant -> retention policy, applied on a schedule (``retention.py``); none: off.
    retention: Mapping[str, Mapping[str, int]] = field(
        default_factory=dict,
        metadata={
            "help": 'JSON object: tenant -> {"erase_after_days": N, "purge_after_days": M}, '
            "applied every retention_interval seconds (off when empty)."
        },
    )
    retention_interval: float = _knob(3600.0, "Seconds between two runs of the retention policies.")
    log_format: str | None = None
    key_cache_seconds: float = _knob(
        5.0, "Seconds a verified API key (or the local-mode check) is trusted."
    )

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        """Environment first, then explicit ``overrides`` (flags) that are not None."""
        env = os.environ if env is None else env
        values: dict[str, Any] = {}
        for f in fields(cls):
            raw = env.get(ENV_PREFIX + f.name.upper())
            if raw is not None:
                values[f.name] = parse_setting(f.name, raw)
        values.update({k: v for k, v in overrides.items() if v is not None})
        return replace(cls(), **values)

    def to_json(self) -> str:
        """Every setting as JSON (``from_json`` reads it back): handed to worker processes."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "fallbacks":
                value = [
                    v
                    if isinstance(v, str)
                    else {"model": v.model, "api_base": v.api_base, "api_key": v.api_key}
                    for v in value
                ]
            elif isinstance(value, tuple):
                value = list(value)
            elif isinstance(value, Mapping):
                value = dict(value)
            out[f.name] = value
        return json.dumps(out)

    @classmethod
    def from_json(cls, raw: str) -> Settings:
        values = json.loads(raw)
        values["fallbacks"] = parse_fallbacks(json.dumps(values.get("fallbacks") or []))
        for f in fields(cls):
            if isinstance(values.get(f.name), list):
                values[f.name] = tuple(values[f.name])
        return cls(**values)

    @property
    def local_only(self) -> bool:
        return self.host in LOOPBACK


def parse_setting(name: str, raw: str) -> Any:
    """``raw`` (a variable's or a flag's text) as setting ``name`` takes it."""
    kinds = {f.name: str(f.type) for f in fields(Settings)}
    if name not in kinds:
        raise ConfigError(f"unknown setting {name!r}", key=name)
    return _parse(name, kinds[name], raw)


def _parse(name: str, kind: str, raw: str) -> Any:
    if not raw and "None" in kind:
        return None
    try:
        if kind.startswith("int"):
            return int(raw)
        if kind.startswith("float"):
            return float(raw)
        if kind == "bool":
            return raw.strip().lower() in ("1", "true", "yes", "on")
        if name == "retention":
            return parse_retention(raw)
        if kind.startswith("Mapping"):
            loaded = json.loads(raw)
            if not isinstance(loaded, dict):
                raise ValueError("expected a JSON object")
            return {str(k): str(v) for k, v in loaded.items()}
        if name == "fallbacks":
            return parse_fallbacks(raw)
        if kind.startswith("tuple"):
            return tuple(p.strip() for p in raw.split(",") if p.strip())
        return raw
    except ValueError as exc:
        raise ConfigError(f"{ENV_PREFIX}{name.upper()}: {exc}", key=name) from None


def parse_retention(raw: str) -> dict[str, dict[str, int]]:
    """``{"tenant": {"erase_after_days": N, ...}, ...}``, each policy validated."""
    from contextledger.retention import policies_from_json

    return {t: p.to_dict() for t, p in policies_from_json(raw).items()}


def parse_fallbacks(raw: str) -> tuple[str | Fallback, ...]:
    """``a, b`` (names) or a JSON list of names and ``{"model", "api_base", "api_key"}``."""
    if not raw.lstrip().startswith("["):
        return tuple(p.strip() for p in raw.split(",") if p.strip())
    loaded = json.loads(raw)
    out: list[str | Fallback] = []
    for item in loaded:
        if isinstance(item, str) and item.strip():
            out.append(item.strip())
            continue
        if not isinstance(item, dict):
            raise ValueError("each fallback is a model name or an object with a 'model'")
        unknown = set(item) - {"model", "api_base", "api_key"}
        model = item.get("model")
        if unknown or not isinstance(model, str) or not model.strip():
            raise ValueError(
                "a fallback object has a 'model' string, and may have 'api_base' and 'api_key'"
            )
        base, key = item.get("api_base"), item.get("api_key")
        if not all(v is None or isinstance(v, str) for v in (base, key)):
            raise ValueError("a fallback's 'api_base' and 'api_key' are strings")
        out.append(Fallback(model.strip(), base or None, key or None))
    return tuple(out)
