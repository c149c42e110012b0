"""API keys: ``cl_<id>_<secret>``, stored as a salted scrypt hash, each tied to a tenant.

Created, listed and revoked by ``contextledger keys`` over an administrator's
connection; the service only reads ``api_keys`` (its role may do nothing else
there). A verified key is remembered for a few seconds by a sha256 of it (never
the key itself), so scrypt's deliberate cost is paid once per key, not per request.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import re
import secrets
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import asyncpg

from contextledger.errors import InvalidArgument

S = "contextledger"
PREFIX = "cl_"
_KEY = re.compile(r"^cl_([0-9a-f]{12})_([A-Za-z0-9_-]{20,100})$")
TENANT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
#: scrypt cost: ~30 ms and 16 MiB per check on this project's machine.
_N, _R, _P = 2**14, 8, 1


def kdf(secret: str, salt: bytes) -> bytes:
    return hashlib.scrypt(secret.encode(), salt=salt, n=_N, r=_R, p=_P, dklen=32)


@dataclass(frozen=True)
class KeyInfo:
    key_id: str
    tenant: str
    name: str
    created_at: datetime
    revoked_at: datetime | None


def check_tenant(tenant: str) -> str:
    if not isinstance(tenant, str) or not TENANT.match(tenant):
        raise InvalidArgument(
            "a tenant is 1-63 letters, digits, '_', '.', '-' (starting with a letter or digit)",
            field="tenant",
        )
    return tenant


async def create_key(conn: asyncpg.Connection, tenant: str, name: str = "") -> tuple[str, str]:
    """Store a new key for ``tenant``; return ``(key_id, key)``. The key is shown once."""
    check_tenant(tenant)
    key_id = secrets.token_hex(6)
    secret = secrets.token_urlsafe(32)
    salt = secrets.token_bytes(16)
    await conn.execute(
        f"INSERT INTO {S}.api_keys (key_id, tenant_id, name, salt, hash)"
        " VALUES ($1, $2, $3, $4, $5)",
        key_id,
        tenant,
        name,
        salt,
        kdf(secret, salt),
    )
    return key_id, f"{PREFIX}{key_id}_{secret}"


async def list_keys(conn: asyncpg.Connection) -> list[KeyInfo]:
    rows = await conn.fetch(
        f"SELECT key_id, tenant_id, name, created_at, revoked_at FROM {S}.api_keys"
        " ORDER BY created_at, key_id"
    )
    return [KeyInfo(*r) for r in rows]


async def revoke_key(conn: asyncpg.Connection, key_id: str) -> bool:
    status: str = await conn.execute(
        f"UPDATE {S}.api_keys SET revoked_at = now() WHERE key_id = $1 AND revoked_at IS NULL",
        key_id,
    )
    return status.endswith(" 1")


class KeyRing:
    """Resolves a presented key to its tenant; knows whether any key exists at all."""

    def __init__(self, pool: Any, *, cache_seconds: float = 5.0) -> None:
        self._pool = pool
        self._ttl = cache_seconds
        self._known: dict[bytes, tuple[str, float]] = {}
        self._any: tuple[bool, float] | None = None

    async def keys_required(self) -> bool:
        """True once any key was ever created: local mode ends with the first key."""
        if self._any is not None and self._any[0]:
            return True  # never goes back to local mode
        now = time.monotonic()
        if self._any is None or now - self._any[1] > self._ttl:
            found = bool(await self._pool.fetchval(f"SELECT EXISTS (SELECT 1 FROM {S}.api_keys)"))
            self._any = (found, now)
        return self._any[0]

    async def tenant_of(self, key: str) -> str | None:
        """The tenant of a valid, unrevoked key; None for anything else."""
        match = _KEY.match(key)
        if match is None:
            return None
        fingerprint = hashlib.sha256(key.encode()).digest()
        now = time.monotonic()
        cached = self._known.get(fingerprint)
        if cached is not None and now - cached[1] <= self._ttl:
            return cached[0]
        row = await self._pool.fetchrow(
            f"SELECT tenant_id, salt, hash FROM {S}.api_keys"
            " WHERE key_id = $1 AND revoked_at IS NULL",
            match.group(1),
        )
        if row is None:
            self._known.pop(fingerprint, None)
            return None
        digest = await asyncio.to_thread(kdf, match.group(2), bytes(row["salt"]))
        if not hmac.compare_digest(digest, bytes(row["hash"])):
            return None
        tenant: str = row["tenant_id"]
        self._known[fingerprint] = (tenant, now)
        return tenant
