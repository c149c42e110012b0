"""Fresh databases on a Citus cluster, for the tests and benches that ``ops/citus`` runs.

A database on Citus is one database of the same name on the coordinator and on every
worker, each with the extension, the workers added on the coordinator. That cannot be
cloned from a template (the shards live in the workers' copies), so each test's
database is made whole: created on every node, ``CREATE EXTENSION citus``,
``citus_add_node``, then migrated by the real migrations (0014 distributes the tables).

``CONTEXTLEDGER_TEST_PG=host:port`` names the coordinator and
``CONTEXTLEDGER_TEST_CITUS_WORKERS=host:port,host:port`` the workers
(tests/integration/conftest.py). ``python -m tests.integration.citus create|drop NAME``
does the same for the benches.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import psycopg

Node = tuple[str, int]
WORKERS_ENV = "CONTEXTLEDGER_TEST_CITUS_WORKERS"


def parse_nodes(text: str) -> list[Node]:
    nodes = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        host, _, port = part.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"not host:port: {part!r}")
        nodes.append((host, int(port)))
    return nodes


def workers_from_env() -> list[Node]:
    return parse_nodes(os.environ.get(WORKERS_ENV, ""))


def _admin(node: Node, dbname: str = "postgres") -> psycopg.Connection:
    host, port = node
    return psycopg.connect(host=host, port=port, user="postgres", dbname=dbname, autocommit=True)


def _quoted(name: str) -> str:
    if not name.replace("_", "").isalnum():
        raise ValueError(f"database name must be [A-Za-z0-9_]: {name!r}")
    return f'"{name}"'


def create(name: str, coordinator: Node, workers: Sequence[Node]) -> str:
    """Database ``name`` on every node, Citus in it, the workers added; its DSN (not
    migrated yet)."""
    for node in (*workers, coordinator):
        with _admin(node) as conn:
            conn.execute(f"CREATE DATABASE {_quoted(name)}")  # type: ignore[arg-type]
        with _admin(node, name) as conn:
            conn.execute("CREATE EXTENSION citus")
    with _admin(coordinator, name) as conn:
        conn.execute("SELECT citus_set_coordinator_host(%s, %s)", coordinator)
        for host, port in workers:
            conn.execute("SELECT citus_add_node(%s, %s)", (host, port))
    return f"postgresql://postgres@/{name}?host={coordinator[0]}&port={coordinator[1]}"


def drop(name: str, coordinator: Node, workers: Sequence[Node]) -> None:
    for node in (coordinator, *workers):
        with _admin(node) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {_quoted(name)} WITH (FORCE)")  # type: ignore[arg-type]


@contextmanager
def database(name: str, coordinator: Node, workers: Sequence[Node]) -> Iterator[str]:
    try:
        yield create(name, coordinator, workers)
    finally:
        drop(name, coordinator, workers)


def main(argv: list[str]) -> int:
    """``create|drop NAME COORDINATOR WORKER[,WORKER]``: prints the DSN on create."""
    action, name, coordinator, workers = argv
    nodes = parse_nodes(coordinator)[0], parse_nodes(workers)
    if action == "create":
        print(create(name, *nodes))
    elif action == "drop":
        drop(name, *nodes)
    else:
        raise SystemExit(f"unknown action {action!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
