"""The portability lint: what keeps the ledger distributable on Citus (issue #27).

Every session table is distributed by ``session_id`` (migration 0014), so:

- a unique index or foreign key of a session table must contain ``session_id`` (a
  foreign key: ``session_id`` to ``session_id`` of a co-located session table, or any
  key of a reference table);
- a statement that touches a session table must name one session (``session_id = $n``):
  Citus then routes it to one shard; the few that cannot are listed in ``CROSS_SESSION``
  with the reason;
- nothing may set a setting for the session (``SET`` without ``LOCAL``, ``RESET``,
  ``set_config(..., false)``), in our statements or the schema's functions, and the
  schema's functions may not ``set_config`` at all: Citus forwards only a transaction's
  ``SET LOCAL`` to the workers.

The statements are read from the package's source (string constants and f-strings,
module constants substituted), so a new statement is checked the day it is written.
"""

from __future__ import annotations

import ast
import importlib
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "service" / "contextledger"
SCHEMA = "contextledger"
#: A statement (not a fragment): it starts with one of these.
_STATEMENT = re.compile(r"^\s*(WITH|SELECT|INSERT|UPDATE|DELETE)\b")
_ONE_SESSION = re.compile(r"\bsession_id\s*=\s*\$\d+")
_INSERT_VALUES = re.compile(r"^\s*INSERT INTO \S+ \(([^)]*)\) VALUES \(([^)]*)\)")
_LITERAL = re.compile(r"'(?:[^']|'')*'")


def names_one_session(sql: str) -> bool:
    """``session_id = $n`` in a condition, or ``$n`` as the ``session_id`` of the one row
    an ``INSERT ... VALUES`` writes."""
    if _ONE_SESSION.search(sql):
        return True
    insert = _INSERT_VALUES.match(sql)
    if insert is None:
        return False
    columns = [c.strip() for c in insert[1].split(",")]
    values = [v.strip() for v in insert[2].split(",")]
    return (
        "session_id" in columns
        and len(columns) == len(values)
        and re.fullmatch(r"\$\d+", values[columns.index("session_id")]) is not None
    )


#: ``SET x`` as a statement (start, or after ``;``), not ``SET LOCAL``/``SET TRANSACTION``
#: (``UPDATE ... SET col`` follows a table name, never a statement boundary).
_SESSION_SET = re.compile(
    r"(?:^|;|\bBEGIN|\bTHEN|\bELSE|\bLOOP)\s*(?:SET\s+(?!LOCAL\b|TRANSACTION\b)|RESET\s)"
)
_SESSION_SET_CONFIG = re.compile(r"set_config\s*\(.*?,\s*false\s*\)", re.IGNORECASE)
_ANY_SET_CONFIG = re.compile(r"\bset_config\s*\(", re.IGNORECASE)

#: Statements on session tables that name no single session, by (module, first words):
#: why each is allowed. A stale entry (its statement gone) fails the lint too.
CROSS_SESSION: dict[tuple[str, str], str] = {
    (
        "contextledger.store.scoped",
        "session-scope",
    ): "session_scope_sql: a direct tenant connection to plain PostgreSQL is scoped once for "
    "its session (two round trips fewer per lone statement); scoped() uses per-transaction "
    "SET LOCAL wherever the citus extension is installed",
    (
        "contextledger.store.postgres.statements",
        "WITH i AS ( SELECT * FROM unnest(",
    ): "APPEND_MESSAGES, the group commit of appends to different sessions: never used on "
    "Citus (PostgresStore turns batching off there: max_batch=1)",
    (
        "contextledger.store.postgres.store",
        "SELECT session_id, created_at, model, config::text, metadata::text, head, last_hash,"
        " view_tokens, view_count, erased_at,",
    ): "list_sessions: a tenant's page of sessions (keyset, bounded by LIMIT): on Citus one "
    "query per shard, by nature; never on the hot path",
    (
        "contextledger.store.postgres.store",
        "SELECT session_id, purged_at, purged_by, reason, events, last_hash FROM"
        " contextledger.purges ORDER BY",
    ): "purges(): the audit listing of every purge, an operator's read",
    (
        "contextledger.store.postgres.store",
        "SELECT session_id, erased_at, erased_by, actor, reason, events, last_hash,",
    ): "erasures(): the audit listing of every erasure, an operator's read",
    (
        "contextledger.store.postgres.store",
        "SELECT session_id FROM contextledger.session_keys WHERE kek_id <> $1",
    ): "kek rotate: every data key not yet under the current KEK, an operator's command",
    (
        "contextledger.store.postgres.store",
        "SELECT session_id FROM contextledger.sessions WHERE parent_session_id = $1",
    ): "purge's check for forks standing on the session (by the parent column's index): a "
    "fork may live on another shard, so on Citus this is one query per shard; purges only",
    (
        "contextledger.store.postgres.forks",
        "SELECT session_id FROM contextledger.sessions WHERE parent_session_id = $1",
    ): "forks(): a session's direct forks (the parent column's index), for the operator and "
    "erase's cascade; a fork may live on another shard; never on the hot path",
    (
        "contextledger.store.postgres.forks",
        "SELECT session_id FROM contextledger.sessions WHERE parent_session_id = ANY($1::text[])",
    ): "descendants(): erase's cascade, a level of forks a statement (each then locked by its "
    "id); forks may live on other shards; erasures only",
    (
        "contextledger.store.postgres.store",
        "SELECT tenant_id FROM contextledger.sessions WHERE tenant_id <>",
    ): "other_tenant(): retention's check that its connection sees one tenant only (LIMIT 1); "
    "an operator's command, once per run",
}


@dataclass(frozen=True)
class Statement:
    module: str
    line: int
    sql: str  # whitespace collapsed

    def where(self) -> str:
        return f"{self.module}:{self.line}"


def _render(node: ast.AST, names: dict[str, object]) -> str | None:
    """A string constant or an f-string as text; ``{name}`` of a module-level string is
    substituted, any other expression left as ``{expr}``."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if not isinstance(node, ast.JoinedStr):
        return None
    out: list[str] = []
    for value in node.values:
        if isinstance(value, ast.Constant):
            out.append(str(value.value))
        elif isinstance(value, ast.FormattedValue):
            expr = value.value
            known = names.get(expr.id) if isinstance(expr, ast.Name) else None
            out.append(known if isinstance(known, str) else "{" + ast.unparse(expr) + "}")
    return "".join(out)


def statements(package: Path = PACKAGE) -> Iterator[Statement]:
    """Every SQL statement text in the package's modules (and ``scoped`` settings)."""
    for path in sorted(package.rglob("*.py")):
        module = ".".join(path.relative_to(package.parent).with_suffix("").parts)
        names = vars(importlib.import_module(module))
        for node in ast.walk(ast.parse(path.read_text())):
            text = _render(node, names)
            if text is not None and (
                "contextledger." in text or "set_config" in text or _SESSION_SET.search(text)
            ):
                yield Statement(module, getattr(node, "lineno", 0), " ".join(text.split()))


def statement_problems(
    found: list[Statement],
    session_tables: set[str],
    allowed: dict[tuple[str, str], str] = CROSS_SESSION,
) -> list[str]:
    """What the lint reports about these statements (empty: portable)."""
    problems: list[str] = []
    used: set[tuple[str, str]] = set()
    touches = re.compile(
        rf"\b{SCHEMA}\.({'|'.join(sorted(map(re.escape, session_tables)))})\b"
        if session_tables
        else r"(?!)"
    )
    for st in found:
        if _SESSION_SET.search(st.sql) or _SESSION_SET_CONFIG.search(st.sql):
            if (st.module, "session-scope") not in allowed:
                problems.append(f"{st.where()}: sets a setting for the session: {st.sql[:120]}")
            else:
                used.add((st.module, "session-scope"))
        if not _STATEMENT.match(st.sql) or not touches.search(_LITERAL.sub("''", st.sql)):
            continue  # not a statement, or one naming a session table only in a literal
        if names_one_session(st.sql):
            continue
        key = next((k for k in allowed if k[0] == st.module and st.sql.startswith(k[1])), None)
        if key is None:
            problems.append(
                f"{st.where()}: touches a session table without `session_id = $n` (not "
                f"single-shard on Citus): {st.sql[:160]}"
            )
        else:
            used.add(key)
    problems += [
        f"CROSS_SESSION lists {k[0]} {k[1][:60]!r}, which no longer exists"
        for k in allowed
        if k not in used
    ]
    return problems


#: The schema's rules, as catalog queries: each row is a problem.
SESSION_TABLES = f"""
SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname = '{SCHEMA}' AND c.relkind IN ('r', 'p')
   AND EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = c.oid
                AND a.attname = 'session_id' AND NOT a.attisdropped)
 ORDER BY 1"""
#: Unique indexes (primary keys and unique constraints included) of session tables whose
#: key columns lack session_id.
UNIQUE_WITHOUT_SESSION = f"""
SELECT t.relname || '.' || i.relname || ': ' || pg_get_indexdef(x.indexrelid)
  FROM pg_index x
  JOIN pg_class i ON i.oid = x.indexrelid
  JOIN pg_class t ON t.oid = x.indrelid
  JOIN pg_namespace n ON n.oid = t.relnamespace
 WHERE n.nspname = '{SCHEMA}' AND x.indisunique
   AND t.relname = ANY($1::text[])
   AND NOT EXISTS (
       SELECT 1 FROM generate_series(0, x.indnkeyatts - 1) k
         JOIN pg_attribute a ON a.attrelid = t.oid AND a.attnum = x.indkey[k]
        WHERE a.attname = 'session_id')
 ORDER BY 1"""
#: Foreign keys touching a session table that do not map session_id to session_id
#: (unless they point at a reference table, $2).
FOREIGN_WITHOUT_SESSION = f"""
SELECT f.relname || '.' || c.conname || ': ' || pg_get_constraintdef(c.oid)
  FROM pg_constraint c
  JOIN pg_class f ON f.oid = c.conrelid
  JOIN pg_class r ON r.oid = c.confrelid
  JOIN pg_namespace n ON n.oid = f.relnamespace
 WHERE n.nspname = '{SCHEMA}' AND c.contype = 'f'
   AND (f.relname = ANY($1::text[]) OR r.relname = ANY($1::text[]))
   AND NOT (r.relname = ANY($2::text[]) AND NOT r.relname = ANY($1::text[]))
   AND NOT EXISTS (
       SELECT 1 FROM generate_subscripts(c.conkey, 1) k
         JOIN pg_attribute fa ON fa.attrelid = c.conrelid AND fa.attnum = c.conkey[k]
         JOIN pg_attribute ra ON ra.attrelid = c.confrelid AND ra.attnum = c.confkey[k]
        WHERE fa.attname = 'session_id' AND ra.attname = 'session_id')
 ORDER BY 1"""
#: The schema's functions, with their source.
FUNCTIONS = f"""
SELECT p.oid::regprocedure::text, p.prosrc FROM pg_proc p
  JOIN pg_namespace n ON n.oid = p.pronamespace
 WHERE n.nspname = '{SCHEMA}' ORDER BY 1"""


def function_problems(functions: list[tuple[str, str]]) -> list[str]:
    """A schema function that sets a setting in a way Citus does not forward."""
    problems = []
    for name, text in functions:
        source = " ".join(text.split())  # UPDATE ...\n SET col is no SET statement
        if _ANY_SET_CONFIG.search(source):
            problems.append(f"{name} calls set_config(): a worker never sees it (SET LOCAL does)")
        if _SESSION_SET.search(source):
            problems.append(f"{name} sets a setting for the session (SET without LOCAL)")
    return problems
