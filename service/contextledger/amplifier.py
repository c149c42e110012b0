"""Amplifier module: mount a contextledger ``Session`` as a coordinator's context manager.

Registered as the ``context-ledger`` entry point in the ``amplifier.modules``
group; a mount plan selects it with ``context: {module: context-ledger, config: {...}}``.

The config holds this module's own options (``MountConfig``: ``session_id``,
``dsn``, ``storage_path``, ``on_unreachable``) and, beside them, session policy
(``ContextConfig`` keys). An unknown key or a bad value raises ``ConfigError``
naming the key, and nothing is mounted.

Where the data goes is resolved as by ``Ledger.open``: the ``dsn`` option, else
``$CONTEXTLEDGER_DSN``, else the embedded PostgreSQL under ``storage_path`` (else
``$CONTEXTLEDGER_HOME``, else the user data dir); the choice is logged once.

``on_unreachable``: ``fail`` (the default) raises ``LedgerUnavailable`` when the
store cannot be reached or started; ``memory`` keeps the agent working on a
``memory://`` session instead (nothing survives the process) and logs one
``ledger_unavailable_using_memory`` warning. Any other failure is raised — a
rejected login (``LedgerCredentialsRejected``: wrong user or password) included,
since falling back would hide a configuration mistake.

The session's hook events are forwarded to ``coordinator.hooks``. ``mount``
returns an async cleanup that closes the ledger; calling it twice is harmless.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import structlog

from contextledger._checks import MAX_SESSION_ID
from contextledger.core.config import ContextConfig
from contextledger.errors import (
    ConfigError,
    ContextLedgerError,
    InvalidArgument,
    LedgerCredentialsRejected,
    LedgerRefused,
    LedgerUnavailable,
)
from contextledger.ledger import Ledger
from contextledger.protocols import ContextManager
from contextledger.store.dsn import MEMORY, Target, resolve_target

__all__ = ["MEMORY_DSN", "SESSION_ID_KEY", "MountConfig", "mount"]

#: Read by Amplifier's loader: the module's type, hence its mount point.
__amplifier_module_type__ = "context"

log = structlog.get_logger(__name__)

MEMORY_DSN = MEMORY
SESSION_ID_KEY = "session_id"
OnUnreachable = Literal["fail", "memory"]

Cleanup = Callable[[], Awaitable[None]]


def _unreachable(exc: BaseException) -> bool:
    """Whether ``exc`` says the store is out of reach, decided on the typed error the store
    boundary raised (``store/errors.py`` translates every driver failure): the server is
    away (``LedgerUnavailable``: down, refusing, unknown host, no answer) or has no such
    database (``DATABASE_MISSING``). A rejected login (``LedgerCredentialsRejected``) is a
    configuration mistake, never "unreachable": falling back would hide it."""
    err: BaseException | None = exc
    seen: set[int] = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, LedgerCredentialsRejected):
            return False
        if isinstance(err, LedgerUnavailable):
            return True
        if isinstance(err, LedgerRefused):
            return err.code == "DATABASE_MISSING"
        if isinstance(err, ContextLedgerError):
            return False
        err = err.__cause__ or err.__context__
    return False


def _coordinator_session_id(coordinator: Any) -> str | None:
    for owner in (coordinator, getattr(coordinator, "session", None)):
        value = getattr(owner, "session_id", None)
        if isinstance(value, str) and value.strip():
            return value
    return None


@dataclass(frozen=True)
class MountConfig:
    """The mount's own options: deployment, not session policy."""

    session_id: str | None = None
    dsn: str | None = None
    storage_path: str | None = None
    on_unreachable: OnUnreachable = "fail"

    KEYS = ("session_id", "dsn", "storage_path", "on_unreachable")

    @classmethod
    def split(cls, config: Mapping[str, Any] | None) -> tuple[MountConfig, dict[str, Any]]:
        """This module's options, and the rest (session policy for ``ContextConfig``)."""
        if config is None:
            return cls(), {}
        if not isinstance(config, Mapping):
            raise ConfigError(
                f"the mount config must be a mapping, not {type(config).__name__}", key="<root>"
            )
        rest = dict(config)
        mine = {k: rest.pop(k) for k in cls.KEYS if k in rest}
        session_id = mine.get("session_id")
        if session_id is not None and (
            not isinstance(session_id, str)
            or not session_id.strip()
            or len(session_id) > MAX_SESSION_ID
            or "\x00" in session_id
        ):
            raise ConfigError(
                f"{SESSION_ID_KEY} must be a non-empty string of at most {MAX_SESSION_ID} "
                f"characters without NUL, got {session_id!r}",
                key=SESSION_ID_KEY,
            )
        for key in ("dsn", "storage_path"):
            value = mine.get(key)
            if value is not None and (not isinstance(value, str) or not value.strip()):
                raise ConfigError(f"{key} must be a non-empty string", key=key)
        on_unreachable = mine.get("on_unreachable", "fail")
        if on_unreachable not in ("fail", "memory"):
            raise ConfigError(
                f"on_unreachable must be 'fail' or 'memory', got {on_unreachable!r}",
                key="on_unreachable",
            )
        storage = mine.get("storage_path")
        return (
            cls(
                session_id,
                mine.get("dsn"),
                os.path.expanduser(storage) if storage else None,
                on_unreachable,
            ),
            rest,
        )

    def target(self, environ: Mapping[str, str] | None = None) -> Target:
        try:
            return resolve_target(
                self.dsn, os.environ if environ is None else environ, home=self.storage_path
            )
        except InvalidArgument as exc:
            raise ConfigError(str(exc.args[0]), key="dsn") from None


def _split_config(config: Mapping[str, Any] | None) -> tuple[MountConfig, ContextConfig]:
    mount_cfg, rest = MountConfig.split(config)
    mount_cfg.target()  # a bad dsn is a config error, before anything is opened
    return mount_cfg, ContextConfig.from_mapping(rest)


async def _open_ledger(mount_cfg: MountConfig, cfg: ContextConfig, session_id: str) -> Ledger:
    target = mount_cfg.target()
    try:
        return await Ledger.open(target.dsn, home=target.home, migrate=True, config=cfg)
    except Exception as exc:
        if mount_cfg.on_unreachable == "fail" or target.kind == "memory" or not _unreachable(exc):
            raise
        log.warning(
            "ledger_unavailable_using_memory",
            store=target.describe(),
            session_id=session_id,
            error=f"{type(exc).__name__}: {exc}",
            hint="on_unreachable: memory was set; nothing this session records will persist",
        )
    return await Ledger.open(MEMORY_DSN, config=cfg)


async def mount(coordinator: Any, config: Mapping[str, Any] | None = None) -> Cleanup:
    """Open (or resume) the session's ledger and mount it at ``context``.

    Raises ``ConfigError`` for a bad config (before anything is opened) and
    ``LedgerUnavailable`` when the store is out of reach (unless
    ``on_unreachable: memory``). Returns the cleanup that closes the ledger.
    """
    mount_cfg, cfg = _split_config(config)
    session_id = mount_cfg.session_id or _coordinator_session_id(coordinator) or str(uuid.uuid4())
    ledger = await _open_ledger(mount_cfg, cfg, session_id)
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
