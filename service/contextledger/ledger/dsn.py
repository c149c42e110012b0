"""DSN spelling: asyncpg wants ``postgresql://``, SQLAlchemy ``postgresql+asyncpg://``."""

from __future__ import annotations

_PREFIXES = ("postgresql+asyncpg://", "postgresql+psycopg://", "postgresql://", "postgres://")


def is_postgres(dsn: str) -> bool:
    return dsn.startswith(_PREFIXES)


def _rest(dsn: str) -> str:
    for prefix in _PREFIXES:
        if dsn.startswith(prefix):
            return dsn[len(prefix):]
    raise ValueError(f"not a PostgreSQL DSN: {redact(dsn)}")


def asyncpg_dsn(dsn: str) -> str:
    return "postgresql://" + _rest(dsn)


def sqlalchemy_url(dsn: str) -> str:
    return "postgresql+asyncpg://" + _rest(dsn)


def redact(dsn: str) -> str:
    """The DSN with any password replaced, for logs and error messages."""
    scheme, sep, rest = dsn.partition("://")
    if not sep or "@" not in rest:
        return dsn
    creds, _, host = rest.rpartition("@")
    user = creds.split(":", 1)[0]
    return f"{scheme}://{user}{':***' if ':' in creds else ''}@{host}"
