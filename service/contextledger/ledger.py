"""``Ledger``: a handle on one store, and where sessions are opened.

``Ledger.open`` chooses the store (embedded PostgreSQL, a server, ``memory://``),
migrates when asked, and keeps per-process things no event records: the token
counter cache and the API keys of summarizer models (configs are recorded redacted).
"""

from __future__ import annotations

import asyncio
import importlib
import os
from collections.abc import Generator, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import structlog

from contextledger import telemetry
from contextledger._checks import (
    check_mapping,
    check_new_session_id,
    check_session_id,
    check_text,
)
from contextledger.appends import utc_now
from contextledger.core.chain import Anchor, VerifyReport
from contextledger.core.config import REDACTED, ContextConfig
from contextledger.core.events import SessionCreated
from contextledger.core.tokens import TokenCounter, get_counter
from contextledger.errors import (
    ChainBroken,
    InvalidArgument,
    LedgerClosed,
    SessionErased,
    SessionExists,
    SessionNotFound,
    StoreError,
)
from contextledger.hooks import PreCompactHandler
from contextledger.retry import RetryPolicy
from contextledger.rollback import fork_seq
from contextledger.session import Session
from contextledger.store.base import Checkpoint, Erasure, RebuildReport, SessionInfo, Store
from contextledger.store.dsn import DSN_ENV, redact, resolve_target
from contextledger.store.memory import MemoryStore
from contextledger.store.sealing import KeyRing, keyring_from

log = structlog.get_logger(__name__)


def warm(counter: TokenCounter, model: str | None, config: ContextConfig) -> None:
    """Load what the first count and the first budget need (a tokenizer, litellm's
    model map: seconds on first use). Blocking: run it through ``asyncio.to_thread``."""
    counter.count_text("warm")
    if model:
        from contextledger.core.model_limits import model_limits

        model_limits(model, config.model_overrides or None)


async def warm_up(*models: str, config: ContextConfig | Mapping[str, Any] | None = None) -> None:
    """Load, once per process, what a first session of ``models`` needs: litellm and its
    model map, and each model's tokenizer (no model: the default one).

    Every part of it already runs off the event loop. But building a tiktoken encoding
    holds the GIL for ~0.1-0.4 s, during which no coroutine runs: await this when your
    application starts (before it serves anything), and the first ``ledger.session()``
    and request afterwards do not stall the loop. Tokenizers are cached per process, so
    every ledger opened later benefits.
    """
    cfg = config if isinstance(config, ContextConfig) else ContextConfig.from_mapping(config)
    from contextledger._litellm import import_litellm

    await asyncio.to_thread(import_litellm)
    # memory://'s recall index tokenizes with bm25s (numpy: ~0.5 s of import)
    await asyncio.to_thread(importlib.import_module, "bm25s.tokenization")
    # recall's lexer (PyStemmer) and the tracer look-up (opentelemetry's API, if installed)
    from contextledger import telemetry
    from contextledger.store.lexical import tokenize

    await asyncio.to_thread(tokenize, "warm", cfg.recall.text_search_config)
    await asyncio.to_thread(telemetry.tracer)
    for model in models or (None,):
        if model is not None:
            check_text(model, "model")
        counter = await asyncio.to_thread(get_counter, cfg.token_counter, model)
        await asyncio.to_thread(warm, counter, model, cfg)


def _operator_keyring(kind: str, home: str | None) -> KeyRing | None:
    """The KEK from the operator's environment (``generate`` only for the embedded server,
    whose home keeps it). Blocking (may read or write the key file)."""
    from pathlib import Path

    def embedded_home() -> Path:
        from contextledger.store.dsn import HOME_ENV
        from contextledger.store.embedded import default_home

        given = home or os.environ.get(HOME_ENV, "").strip()
        return Path(given) if given else default_home()

    return keyring_from(os.environ, home=embedded_home if kind == "embedded" else None)


class Ledger:
    """A handle on one store. ``async with Ledger.open(dsn) as ledger: ...``"""

    def __init__(
        self,
        store: Store,
        *,
        config: ContextConfig | Mapping[str, Any] | None = None,
        dsn: str | None = None,
        retry_appends: RetryPolicy | None = None,
    ) -> None:
        self.store = store
        self.dsn = dsn
        #: Appends with an idempotency key are retried on LedgerUnavailable (opt-in).
        self.retry_appends = retry_appends
        self.config = (
            config if isinstance(config, ContextConfig) else (ContextConfig.from_mapping(config))
        )
        #: Where session hook events are forwarded too (an Amplifier coordinator's hooks).
        self.hook_target: Any | None = None
        #: Default pre-compact handler for sessions opened from here.
        self.pre_compact: PreCompactHandler | None = None
        self._secrets: dict[tuple[str, str | None], str] = {}
        self._counters: dict[tuple[str, str | None], TokenCounter] = {}
        self._warm: set[tuple[str, str | None]] = set()
        self._warm_models: set[str] = set()
        self.remember_secrets(self.config)
        self._closed = False
        self._background: set[asyncio.Task[Any]] = set()
        self._resumable: set[asyncio.Task[Any]] = set()
        self._closing = False
        #: seconds ``close()`` waits for background summaries before cancelling them
        self.close_timeout = 30.0

    def __repr__(self) -> str:
        where = redact(self.dsn) if self.dsn else self.store.kind
        return f"<Ledger {where}>"

    @classmethod
    def open(
        cls,
        dsn: str | None = None,
        *,
        home: str | None = None,
        migrate: bool | None = None,
        config: ContextConfig | Mapping[str, Any] | str | None = None,
        pool_size: int = 10,
        tenant: str | None = None,
        role: str | None = None,
        retry_appends: RetryPolicy | None = None,
        pgbouncer: bool = False,
        keyring: KeyRing | None = None,
    ) -> _Opener:
        """Open a ledger on ``dsn`` (``postgresql://…`` or ``memory://``); without one,
        on ``$CONTEXTLEDGER_DSN``; without that, on the embedded PostgreSQL under
        ``home`` (default ``$CONTEXTLEDGER_HOME``, else the user data dir). The choice
        is logged once (``ledger_target``, credentials redacted).

        The embedded server is migrated on first use; another server must already be
        migrated unless ``migrate=True`` (otherwise ``MigrationRequired`` says how).
        ``config`` (dict, YAML text or ``ContextConfig``) is the default for sessions.
        ``retry_appends`` (a ``RetryPolicy``) retries appends that carry an idempotency
        key when the server is briefly unavailable (safe: a retry never writes twice).
        ``tenant`` scopes every connection to one tenant's rows (row-level security,
        migration 0004) and ``role`` switches its connections to that database role;
        the service passes both, embedded use needs neither. ``pool_size`` connections
        serve appends and reads; live recall searches open up to half as many more, as
        they are needed (they run with their own settings, see ``PostgresStore.search``).
        ``pgbouncer``: the DSN reaches PostgreSQL through PgBouncer in transaction mode
        (asyncpg's statement cache off, no startup parameters: ``PostgresStore.connect``).
        ``keyring``: the key-encryption key(s) new sessions' data keys are wrapped under
        (``store/sealing.py``); default: the operator's ``$CONTEXTLEDGER_KEK`` (or
        ``$CONTEXTLEDGER_KEK_FILE``), none when unset. With one, message content is
        stored sealed and a session can be erased (``erase``).
        """
        return _Opener(
            cls,
            _OpenArgs(
                dsn,
                home,
                migrate,
                config,
                pool_size,
                tenant,
                role,
                retry_appends,
                pgbouncer,
                keyring,
            ),
        )

    @classmethod
    async def _open(cls, args: _OpenArgs) -> Ledger:
        dsn, home, migrate, config = args.dsn, args.home, args.migrate, args.config
        pool_size, retry_appends, keyring = args.pool_size, args.retry_appends, args.keyring
        if retry_appends is not None and not isinstance(retry_appends, RetryPolicy):
            raise InvalidArgument("retry_appends must be a RetryPolicy", field="retry_appends")
        from pathlib import Path

        if isinstance(pool_size, bool) or not isinstance(pool_size, int) or not pool_size >= 1:
            raise InvalidArgument("pool_size must be an int >= 1", field="pool_size")
        cfg = config if isinstance(config, ContextConfig) else ContextConfig.from_mapping(config)
        target = resolve_target(dsn, os.environ, home=home)
        log.info(
            "ledger_target",
            kind=target.kind,
            source=target.source,
            target=target.describe(),
        )
        if keyring is None:
            keyring = await asyncio.to_thread(_operator_keyring, target.kind, home)
        elif not isinstance(keyring, KeyRing):
            raise InvalidArgument("keyring must be a KeyRing", field="keyring")
        if target.kind == "memory":
            return cls(
                MemoryStore(keyring=keyring),
                config=cfg,
                dsn=target.dsn,
                retry_appends=retry_appends,
            )
        # asyncpg, SQLAlchemy and alembic take a while to import: not on the event loop
        migrations: Any = await asyncio.to_thread(
            importlib.import_module, "contextledger.store.migrate"
        )
        postgres: Any = await asyncio.to_thread(
            importlib.import_module, "contextledger.store.postgres"
        )
        if target.dsn is None:
            from contextledger.store import embedded

            dsn = await asyncio.to_thread(embedded.start, Path(home) if home else None)
            migrate = True if migrate is None else migrate
        else:
            dsn = target.dsn
        head = await asyncio.to_thread(migrations.head_revision)
        try:
            store = await postgres.PostgresStore.connect(
                dsn,
                max_size=pool_size,
                tenant=args.tenant,
                role=args.role,
                pgbouncer=args.pgbouncer,
                keyring=keyring,
            )
        except StoreError as exc:  # say which DSN to fix: the argument or the variable
            if target.dsn is not None:
                where = "the dsn argument" if target.source == "argument" else f"${DSN_ENV}"
                exc.args = (f"{exc.args[0]} (the DSN came from {where})",)
            raise
        try:
            if migrate and await store.schema_revision() != head:
                await migrations.upgrade(dsn)
            await store.require_revision(head)
        except BaseException:
            await store.close()
            raise
        return cls(store, config=cfg, dsn=dsn, retry_appends=retry_appends)

    def check_open(self) -> None:
        """``LedgerClosed`` once ``close()`` ran (every operation asks first)."""
        if self._closed:
            raise LedgerClosed("this ledger is closed")

    def keep(self, task: asyncio.Task[Any], *, resumable: bool = False) -> None:
        """Track work a session started in the background (a summary, a recall search
        started at a tool call): ``close()`` lets it land or cancels it; ``resumable``
        work (a backlog's embedding, which the next request starts again) is cancelled
        at once."""
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        if resumable:
            if self._closing:  # (started by a request still in flight as close began)
                task.cancel()
            self._resumable.add(task)
            task.add_done_callback(self._resumable.discard)

    def secret(self, model: str, api_base: str | None) -> str | None:
        """The API key a config gave for ``model`` at ``api_base`` (configs are recorded
        redacted: the keys stay in this process)."""
        return self._secrets.get((model, api_base))

    def remember_secrets(self, config: ContextConfig) -> None:
        """API keys stay in this process: the ledger records configs redacted."""
        for m in config.summarizer.models:
            if m.api_key and m.api_key != REDACTED:
                self._secrets[(m.model, m.api_base)] = m.api_key
        rc = config.recall
        if rc.embedding_model and rc.embedding_api_key and rc.embedding_api_key != REDACTED:
            self._secrets[(rc.embedding_model, rc.embedding_api_base)] = rc.embedding_api_key

    def config_from(self, stored: Mapping[str, Any]) -> ContextConfig:
        """The config a session recorded (``stored``), or the ledger's when it has none."""
        return ContextConfig.from_recorded(stored) if stored else self.config

    def counter_for(self, model: str | None, config: ContextConfig) -> TokenCounter:
        """The token counter for ``model`` under ``config.token_counter`` (cached).
        Blocking on first use (a tokenizer loads): async code uses ``warm_counter``."""
        key = (config.token_counter, model)
        counter = self._counters.get(key)
        if counter is None:
            counter = self._counters[key] = get_counter(config.token_counter, model)
        return counter

    async def warm_counter(self, model: str | None, config: ContextConfig) -> TokenCounter:
        """``counter_for``, with the tokenizer and the model's limits loaded off the loop."""
        key = (config.token_counter, model)
        counter = self._counters.get(key)
        if counter is None or key not in self._warm:
            counter = await asyncio.to_thread(self.counter_for, model, config)
            await asyncio.to_thread(warm, counter, model, config)
            self._warm.add(key)
        return counter

    async def warm_model(self, model: str, config: ContextConfig) -> None:
        """Resolve ``model``'s limits off the loop the first time (litellm's map)."""
        if model not in self._warm_models:
            from contextledger.core.model_limits import model_limits

            await asyncio.to_thread(model_limits, model, config.model_overrides or None)
            self._warm_models.add(model)

    async def session(
        self,
        session_id: str,
        *,
        create: bool = True,
        model: str | None = None,
        config: ContextConfig | Mapping[str, Any] | str | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> Session:
        """Open (or create) a session. A different ``config`` or ``model`` is recorded."""
        self.check_open()
        check_session_id(session_id)
        if model is not None:
            check_text(model, "model")
        meta = check_mapping(metadata, "metadata")
        passed: ContextConfig | None = None
        if isinstance(config, ContextConfig):
            passed = config
        elif config is not None:
            passed = self.config.merged(config)
        if passed is not None:
            self.remember_secrets(passed)
        try:
            info = await self.store.session_info(session_id)
        except SessionErased:
            raise  # erased for good: its id is never reused
        except SessionNotFound:
            if not create:
                raise
            check_new_session_id(session_id)
            effective = passed or self.config
            try:
                info = await self.store.create_session(
                    session_id,
                    SessionCreated(model, effective.to_dict(), meta),
                    created_at=utc_now(),
                )
            except SessionExists:  # created concurrently: open it instead
                info = await self.store.session_info(session_id)
        stored = self.config_from(info.config)
        counter = await self.warm_counter(info.model, stored)
        session = Session(self, info, stored, counter)
        if config is not None and not isinstance(config, ContextConfig):
            wanted = stored.merged(config)
        else:
            wanted = passed or stored
        changed = wanted.to_dict() != stored.to_dict()
        new_model = model if model is not None and model != info.model else None
        if changed or new_model:
            await session._change(wanted if changed else None, new_model)
        if not changed:
            session._state.config = wanted  # same settings, possibly with this process's secrets
        return session

    async def fork(
        self,
        source_id: str,
        new_id: str,
        *,
        at: Checkpoint | str | int | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> Session:
        """Fork ``source_id`` at ``at`` (a ``Checkpoint``, a label, a seq; default its head)
        into a new session ``new_id`` and open it.

        Copy-on-write: one ``session.forked`` event pointing at (parent, seq, hash), no
        copy of the parent's events, whatever its length. The fork's view is the
        parent's ``view_at(seq)`` item for item; ``verify`` of the fork covers the
        parent prefix; the parent goes on unaffected. ``metadata`` defaults to the
        parent's. ``SessionExists`` if ``new_id`` is taken.
        """
        self.check_open()
        check_session_id(source_id)
        check_new_session_id(new_id)
        meta = check_mapping(metadata, "metadata") if metadata is not None else None
        info = await self.store.session_info(source_id)
        seq = await fork_seq(at, lambda: self.store.checkpoints(source_id), source_id, info.head)
        with telemetry.span(
            "fork_memory",
            {
                "gen_ai.operation.name": "fork_memory",
                "gen_ai.conversation.id": new_id,
                "contextledger.parent.id": source_id,
                "contextledger.parent.seq": seq,
            },
        ):
            await self.store.fork_session(
                new_id,
                source_id,
                seq,
                created_at=utc_now(),
                metadata=info.metadata if meta is None else meta,
            )
        return await self.session(new_id, create=False)

    async def forks(self, session_id: str) -> list[str]:
        """The ids of the sessions forked directly from ``session_id``."""
        self.check_open()
        return await self.store.forks(check_session_id(session_id))

    async def sessions(
        self, *, after: tuple[datetime, str] | None = None, limit: int | None = None
    ) -> list[SessionInfo]:
        """Sessions oldest first (creation time, then id); a page: the ``limit`` after
        ``after``, the ``(created_at, session_id)`` of the last one already shown."""
        self.check_open()
        wrong = isinstance(limit, bool) or not isinstance(limit, int) or limit < 1
        if limit is not None and wrong:
            raise InvalidArgument("limit must be a positive int", field="limit")
        if after is not None:
            created, last = after if isinstance(after, tuple) and len(after) == 2 else (None, None)
            if not isinstance(created, datetime) or created.tzinfo is None:
                raise InvalidArgument(
                    "after must be (an aware created_at datetime, a session id)", field="after"
                )
            after = (created, check_session_id(last))
        return await self.store.list_sessions(after=after, limit=limit)

    async def anchor(self, session_id: str) -> Anchor:
        """The session's current (seq, hash): keep it elsewhere, pass it to ``verify``."""
        self.check_open()
        info = await self.store.session_info(check_session_id(session_id))
        return Anchor(info.head, info.last_hash)

    async def verify(self, session_id: str, *, anchor: Anchor | None = None) -> VerifyReport:
        """Walk the hash chain; with ``anchor``, also require that it still reaches it."""
        self.check_open()
        report = await self.store.verify(check_session_id(session_id))
        if anchor is None or not report.ok:
            return report
        if not isinstance(anchor, Anchor):
            raise InvalidArgument("anchor must be an Anchor (Anchor.parse('SEQ:HASH'))")
        at = [e async for e in self.store.stored_events(session_id, anchor.seq, anchor.seq)]
        if not at or at[0].hash != anchor.hash:
            return VerifyReport(
                session_id,
                False,
                report.events,
                anchor.seq,
                f"the chain no longer reaches anchor {anchor} "
                + ("(the event is gone: truncated?)" if not at else "(a different event)"),
            )
        return report

    async def verify_all(self) -> list[VerifyReport]:
        """``verify`` every session of the ledger, one report each (O(all events))."""
        return [await self.store.verify(s.session_id) for s in await self.sessions()]

    async def rebuild(
        self, session_id: str | None = None, *, force: bool = False
    ) -> list[RebuildReport]:
        """Recompute view rows from the events; report (and repair) any difference.

        A session whose chain does not verify is refused (``ChainBroken``): its
        events cannot be trusted to derive a view from, unless ``force``.
        """
        self.check_open()
        ids = (
            [check_session_id(session_id)]
            if session_id is not None
            else [s.session_id for s in await self.store.list_sessions() if s.erased_at is None]
        )
        if not force:
            for i in ids:
                report = await self.store.verify(i)
                if not report.ok:
                    raise ChainBroken(
                        f"session {i!r} does not verify (seq {report.first_bad_seq}: "
                        f"{report.reason}); not rebuilding from it (force to override)",
                        session_id=i,
                        seq=report.first_bad_seq,
                    )
        return [await self.store.rebuild(i) for i in ids]

    async def erase(
        self, session_id: str, *, reason: str, actor: str | None = None
    ) -> list[Erasure]:
        """Erase a session by destroying its data key: its content is unreadable from
        then on (in this database, its replicas and its backups alike), every derived
        plaintext copy is removed, the chain still verifies, and an audit record says who
        erased it, when and why (``erasures``). Forks of it go with it, in the same
        transaction (their prefix is its content). Returns the audit records, the
        session's first. ``SessionNotEncrypted`` (use ``purge``) for a session
        written without a data key; ``SessionErased`` if it already was."""
        self.check_open()
        check_session_id(session_id)
        reason = check_text(reason, "reason", limit=1000).strip()
        if actor is not None:
            check_text(actor, "actor")
        receipts = await self.store.erase(session_id, reason, actor=actor)
        log.info("session_erased", session_id=session_id, forks=len(receipts) - 1)
        return receipts

    async def erasures(self) -> list[Erasure]:
        """Every erasure's audit record, oldest first."""
        self.check_open()
        return await self.store.erasures()

    async def close(self) -> None:
        """Let background summaries land (or cancel them after ``close_timeout``), then
        close the store's connections. Idempotent; any call after it is ``LedgerClosed``."""
        if not self._closed:
            self._closing = True
            for task in self._resumable:
                task.cancel()
            loop = asyncio.get_running_loop()
            deadline = loop.time() + self.close_timeout
            # summaries in flight: let them land, or cancel them cleanly; again for work
            # kept meanwhile (a request still in flight as close began)
            while pending := set(self._background):
                left = max(0.0, deadline - loop.time())
                _, late = await asyncio.wait(pending, timeout=left)
                for task in late:
                    task.cancel()
                await asyncio.gather(*late, return_exceptions=True)
            self._closed = True
            await self.store.close()


@dataclass(frozen=True)
class _OpenArgs:
    """``Ledger.open``'s arguments (documented there), kept until it is awaited or entered."""

    dsn: str | None
    home: str | None
    migrate: bool | None
    config: ContextConfig | Mapping[str, Any] | str | None
    pool_size: int
    tenant: str | None
    role: str | None
    retry_appends: RetryPolicy | None
    pgbouncer: bool
    keyring: KeyRing | None


class _Opener:
    """``Ledger.open(...)`` works both as ``await`` and as ``async with``."""

    def __init__(self, cls: type[Ledger], args: _OpenArgs) -> None:
        self._cls, self._args = cls, args
        self._ledger: Ledger | None = None

    def __await__(self) -> Generator[Any, None, Ledger]:
        return self._cls._open(self._args).__await__()

    async def __aenter__(self) -> Ledger:
        self._ledger = await self._cls._open(self._args)
        return self._ledger

    async def __aexit__(self, *exc: object) -> None:
        if self._ledger is not None:
            await self._ledger.close()
