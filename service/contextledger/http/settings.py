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


@dataclass(frozen=True)
class Settings:
    """Everything ``create_app`` needs. ``from_env`` reads ``CONTEXTLEDGER_<NAME>``."""

    dsn: str | None = None  # None → the embedded PostgreSQL under ``home``
    home: str | None = None
    host: str = "127.0.0.1"
    port: int = 8765
    #: The database role tenant connections switch to ("" keeps the DSN's own user).
    service_role: str = "contextledger_service"
    #: The service role's password, where the server asks for one (it logs in as the role
    #: with it; without a login it switches to the role from the DSN's user).
    service_password: str | None = None
    pool_size: int = 4  # per tenant
    migrate: bool = True
    #: Where the proxy forwards (an OpenAI-compatible base URL) and with which key.
    upstream_api_base: str | None = None
    upstream_api_key: str | None = None
    #: Client model name → litellm model (default: ``<upstream_provider>/<name>``).
    model_map: Mapping[str, str] = field(default_factory=dict)
    #: litellm provider for an OpenAI-compatible ``upstream_api_base``. ``hosted_vllm``
    #: speaks plain OpenAI HTTP through litellm's own client; ``openai`` goes through the
    #: OpenAI SDK, whose request transform cost ~30 ms per call here (bench/service.py).
    upstream_provider: str = "hosted_vllm"
    #: Relay requests for an OpenAI-compatible upstream (``upstream_api_base`` with a
    #: ``hosted_vllm/`` or ``openai/`` model) with the proxy's own HTTP client instead of
    #: litellm, ~7 ms of CPU less a call (http/upstream.py). Off: litellm carries all.
    upstream_relay: bool = True
    #: litellm models tried in order when the upstream fails: ``a,b`` (each with the
    #: primary's base and key), or a JSON list of names and ``{"model", "api_base",
    #: "api_key"}`` objects (each at its own endpoint: ``Fallback``).
    fallbacks: tuple[str | Fallback, ...] = ()
    #: Forward the client's ``Authorization`` bearer to the upstream instead of ours.
    pass_client_key: bool = False
    upstream_timeout: float = 600.0
    upstream_retries: int = 0
    #: Budget of the request view the proxy sends (None: from the model's limits).
    proxy_token_budget: int | None = None
    log_format: str | None = None
    #: Seconds a verified API key (or the local-mode check) is trusted before re-reading.
    key_cache_seconds: float = 5.0

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
