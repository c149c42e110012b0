"""Amplifier module: mount a contextledger ``Session`` as a coordinator's context manager.

Registered as the ``context-ledger`` entry point in the ``amplifier.modules``
group; a mount plan selects it with ``context: {module: context-ledger, config: {...}}``.

Config keys are those of ``ContextConfig`` (validated by
``ContextConfig.from_mapping``: an unknown key or a bad value raises
``ConfigError`` naming the key, and nothing is mounted), plus one of this module's:

``session_id``
    The ledger session to open or resume. Default: the coordinator's
    ``session_id`` (so resuming an Amplifier session resumes its ledger),
    else ``coordinator.session.session_id``, else a new uuid4.
``dsn``
    ``postgresql://…`` (migrated on mount if needed), ``memory://`` (nothing
    persisted), or absent: the embedded PostgreSQL under ``storage_path``
    (default ``$CONTEXTLEDGER_HOME``, else the user data dir).
``storage_path``
    Home of the embedded PostgreSQL (``~`` is expanded).

Graceful degradation: if the store cannot be reached or started (connection
refused or lost, unknown host, database or role, authentication failure, the
embedded server failing to start), the session lives in memory instead and one
``ledger_unavailable_using_memory`` warning is logged: the agent keeps working,
but nothing it remembers survives the process. Any other failure is raised.

The session's hook events (``context:message_added:debug``,
``context:pre_compact``, ``context:post_compact``, ...) are forwarded to
``coordinator.hooks``. ``mount`` returns an async cleanup that closes the
ledger; calling it twice is harmless.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import structlog

from .config import ContextConfig
from .errors import ConfigError, LedgerUnavailable
from .ledger.dsn import is_postgres, redact
from .protocols import ContextManager
from .session import MAX_SESSION_ID, Ledger

__all__ = ["MEMORY_DSN", "SESSION_ID_KEY", "mount"]

#: Read by Amplifier's loader: the module's type, hence its mount point.
__amplifier_module_type__ = "context"

log = structlog.get_logger(__name__)

MEMORY_DSN = "memory://"
#: The one config key that is not a ``ContextConfig`` key.
SESSION_ID_KEY = "session_id"
#: SQLSTATE classes/codes that mean "this store cannot be used from here": connection
#: exception, invalid authorization, insufficient resources, unknown database,
#: server starting up or shutting down.
_UNREACHABLE_SQLSTATE_CLASSES = frozenset({"08", "28", "53"})
_UNREACHABLE_SQLSTATES = frozenset({"3D000", "57P01", "57P02", "57P03"})

Cleanup = Callable[[], Awaitable[None]]


def _unreachable(exc: BaseException) -> bool:
    """Whether ``exc`` (or anything it wraps) says the store is out of reach."""
    stack: list[BaseException | None] = [exc]
    seen: set[int] = set()
    while stack:
        err = stack.pop()
        if err is None or id(err) in seen:
            continue
        seen.add(id(err))
        if isinstance(err, LedgerUnavailable | OSError):
            return True
        code = getattr(err, "sqlstate", None)
        if isinstance(code, str) and (
                code[:2] in _UNREACHABLE_SQLSTATE_CLASSES or code in _UNREACHABLE_SQLSTATES):
            return True
        orig = getattr(err, "orig", None)  # SQLAlchemy's DBAPIError
        stack.extend([err.__cause__, err.__context__,
                      orig if isinstance(orig, BaseException) else None])
    return False


def _coordinator_session_id(coordinator: Any) -> str | None:
    for owner in (coordinator, getattr(coordinator, "session", None)):
        value = getattr(owner, "session_id", None)
        if isinstance(value, str) and value.strip():
            return value
    return None


def _split_config(config: Mapping[str, Any] | str | None) -> tuple[ContextConfig, str | None]:
    raw: Mapping[str, Any] | str | None = config
    session_id: Any = None
    if isinstance(config, Mapping):
        rest = dict(config)
        session_id = rest.pop(SESSION_ID_KEY, None)
        raw = rest
        if session_id is not None and (
                not isinstance(session_id, str) or not session_id.strip()
                or len(session_id) > MAX_SESSION_ID or "\x00" in session_id):
            raise ConfigError(
                f"{SESSION_ID_KEY} must be a non-empty string of at most {MAX_SESSION_ID} "
                f"characters without NUL, got {session_id!r}", key=SESSION_ID_KEY)
    cfg = ContextConfig.from_mapping(raw)
    if cfg.dsn is not None and cfg.dsn != MEMORY_DSN and not is_postgres(cfg.dsn):
        raise ConfigError(
            f"dsn must be {MEMORY_DSN!r} or a postgresql:// URL, got {redact(cfg.dsn)!r}",
            key="dsn")
    return cfg, session_id


def _home(cfg: ContextConfig) -> str | None:
    return os.path.expanduser(cfg.storage_path) if cfg.storage_path else None


async def _open_ledger(cfg: ContextConfig, session_id: str) -> Ledger:
    home = _home(cfg)
    try:
        return await Ledger.open(cfg.dsn, home=home, migrate=True, config=cfg)
    except Exception as exc:
        if cfg.dsn == MEMORY_DSN or not _unreachable(exc):
            raise
        log.warning(
            "ledger_unavailable_using_memory",
            store=redact(cfg.dsn) if cfg.dsn else f"embedded:{home or '$CONTEXTLEDGER_HOME'}",
            session_id=session_id,
            error=f"{type(exc).__name__}: {exc}",
        )
    return await Ledger.open(MEMORY_DSN, config=cfg)


async def mount(coordinator: Any, config: Mapping[str, Any] | None = None) -> Cleanup:
    """Open (or resume) the session's ledger and mount it at ``context``.

    Raises ``ConfigError`` for a bad config (before anything is opened). Returns
    the cleanup that closes the ledger.
    """
    cfg, session_id = _split_config(config)
    session_id = session_id or _coordinator_session_id(coordinator) or str(uuid.uuid4())
    ledger = await _open_ledger(cfg, session_id)
    try:
        hooks = getattr(coordinator, "hooks", None)
        if hooks is not None and callable(getattr(hooks, "emit", None)):
            ledger.hook_target = hooks  # read by Session.__init__: set before opening
        session = await ledger.session(session_id, config=cfg)
        context: ContextManager = session  # checked statically by mypy
        await coordinator.mount("context", context)
    except BaseException:
        await ledger.close()
        raise

    async def cleanup() -> None:
        await ledger.close()

    return cleanup
