"""DSN spelling (asyncpg wants ``postgresql://``, SQLAlchemy ``postgresql+asyncpg://``),
redaction, and where a ledger's data goes (``resolve_target``)."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from contextledger.errors import ConfigError, InvalidArgument

_PREFIXES = ("postgresql+asyncpg://", "postgresql+psycopg://", "postgresql://", "postgres://")


def is_postgres(dsn: str) -> bool:
    return dsn.startswith(_PREFIXES)


def _rest(dsn: str) -> str:
    for prefix in _PREFIXES:
        if dsn.startswith(prefix):
            return dsn[len(prefix) :]
    raise ValueError(f"not a PostgreSQL DSN: {redact(dsn)}")


#: libpq's ``connect_timeout`` in a URL's query (asyncpg would send it to the server as a
#: setting, which refuses it, and wait its own 60 s instead).
_CONNECT_TIMEOUT = re.compile(r"([?&])connect_timeout=([^&#]*)&?", re.IGNORECASE)


def asyncpg_dsn(dsn: str) -> str:
    """``dsn`` as asyncpg takes it: its scheme, and without ``connect_timeout`` (passed
    as asyncpg's ``timeout`` instead: ``connect_timeout``)."""
    rest = _CONNECT_TIMEOUT.sub(lambda m: m[1], _rest(dsn))
    return "postgresql://" + rest.rstrip("?&")


def connect_timeout(dsn: str) -> float | None:
    """The seconds a DSN's ``connect_timeout`` gives connecting (libpq's meaning; 0 or
    none: asyncpg's default). A value that is not a number is a ``ConfigError``."""
    m = _CONNECT_TIMEOUT.search(_rest(dsn))
    if m is None:
        return None
    try:
        seconds = float(m[2])
    except ValueError:
        raise ConfigError(
            f"connect_timeout must be a number of seconds, not {m[2]!r}", key="dsn"
        ) from None
    if not math.isfinite(seconds) or seconds < 0:
        raise ConfigError("connect_timeout must be a number of seconds >= 0", key="dsn")
    return seconds or None


def with_user(dsn: str, user: str, password: str | None = None) -> str:
    """``dsn`` (asyncpg's spelling) logging in as ``user`` instead, with ``password``
    (none: the server's trust, peer or a ``.pgpass`` decides)."""
    from urllib.parse import quote

    netloc, slash, tail = _rest(dsn).partition("/")
    creds = quote(user, safe="") + (":" + quote(password, safe="") if password else "")
    return f"postgresql://{creds}@{netloc.rpartition('@')[2]}{slash}{tail}"


def sqlalchemy_url(dsn: str) -> str:
    return "postgresql+asyncpg://" + asyncpg_dsn(dsn).removeprefix("postgresql://")


#: ``?password=…``/``&sslpassword=…`` in a URL's query, ``password=…`` in libpq's
#: key=value form (quoted or not).
_QUERY_SECRET = re.compile(r"([?&](?:ssl)?password=)[^&#]*", re.IGNORECASE)
_KEYVALUE_SECRET = re.compile(r"(\b(?:ssl)?password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", re.IGNORECASE)


def redact(dsn: str) -> str:
    """The DSN with any password replaced, for logs and error messages: in the URL's
    user info, in its query (``?password=``), or in libpq's key=value form."""
    scheme, sep, rest = dsn.partition("://")
    if not sep:
        return _KEYVALUE_SECRET.sub(r"\1***", dsn)
    rest = _QUERY_SECRET.sub(r"\1***", rest)
    netloc, slash, tail = rest.partition("/")
    if "@" not in netloc:
        return f"{scheme}://{rest}"
    creds, _, host = netloc.rpartition("@")
    user = creds.split(":", 1)[0]
    return f"{scheme}://{user}{':***' if ':' in creds else ''}@{host}{slash}{tail}"


#: Names the server when ``Ledger.open`` gets no ``dsn`` (the CLI reads it too).
DSN_ENV = "CONTEXTLEDGER_DSN"
#: Home of the embedded PostgreSQL when ``home`` is not given.
HOME_ENV = "CONTEXTLEDGER_HOME"
MEMORY = "memory://"
Source = Literal["argument", "environment", "default"]


@dataclass(frozen=True)
class Target:
    """Where a ledger's data goes, and why: the one answer ``Ledger.open``, the CLI and
    the Amplifier mount all use."""

    kind: Literal["postgres", "memory", "embedded"]
    dsn: str | None  # None for the embedded server (its DSN is known once it runs)
    home: str | None  # the embedded server's home, when given
    source: Source

    def describe(self) -> str:
        """For logs and messages: credentials redacted."""
        if self.kind == "embedded":
            where = self.home or f"${HOME_ENV} (or the user data dir)"
            return f"embedded PostgreSQL under {where}"
        assert self.dsn is not None
        return redact(self.dsn)


def resolve_target(
    dsn: str | None, environ: Mapping[str, str], *, home: str | None = None
) -> Target:
    """The argument, else ``$CONTEXTLEDGER_DSN``, else the embedded server.

    Pure (``environ`` is passed in). A value that is neither ``memory://`` nor a
    ``postgresql://`` URL is an ``InvalidArgument`` naming where it came from.
    """
    source: Source = "argument"
    if dsn is None:
        env = environ.get(DSN_ENV, "").strip()
        if env:
            dsn, source = env, "environment"
    if dsn is None:
        return Target("embedded", None, home, "default")
    where = "dsn" if source == "argument" else f"${DSN_ENV}"
    if not isinstance(dsn, str):
        raise InvalidArgument(
            f"{where} must be None (embedded), {MEMORY!r} or a postgresql:// URL, "
            f"not {type(dsn).__name__}",
            field="dsn",
        )
    if dsn == MEMORY:
        return Target("memory", dsn, None, source)
    if is_postgres(dsn):
        return Target("postgres", dsn, None, source)
    raise InvalidArgument(
        f"{where} must be None (embedded), {MEMORY!r} or a postgresql:// URL, got {redact(dsn)!r}",
        field="dsn",
    )
