"""Embeddings for hybrid recall on PostgreSQL (pgvector, where the server has it)."""

from __future__ import annotations

import json
from collections.abc import Collection, Sequence
from typing import Any

import asyncpg
import structlog

from contextledger.core.encoding import dumps
from contextledger.core.recall import Recalled
from contextledger.store.errors import translated
from contextledger.store.lineage import segments
from contextledger.store.postgres.forks import Lineages
from contextledger.store.postgres.placeholders import bind
from contextledger.store.postgres.search import (
    _ON_BRANCH,
    _ON_GIVEN_BRANCH,
    _POSTING_ON_BRANCH,
    _POSTING_ON_GIVEN_BRANCH,
    seq_ranges,
)
from contextledger.store.postgres.statements import S, _opened
from contextledger.store.postgres.warm import RECALL_MESSAGES

log = structlog.get_logger(__name__)

#: Made the first time hybrid recall finds pgvector (a server may get the extension after
#: it was migrated), as every table is: the tenant in its key, row-level security, the
#: service role's grant (migration 0019 brought an earlier table to this). ``available_from``
#: is the head of the request that computed it (or the seq after the head a background
#: batch was stored at): a replay at seq S uses those from <= S only.
EMBEDDINGS_DDL = f"""
DO $$ BEGIN
    IF to_regclass('{S}.event_embeddings') IS NOT NULL THEN
        RETURN;
    END IF;
    CREATE TABLE {S}.event_embeddings (
        tenant_id text NOT NULL DEFAULT {S}.current_tenant(),
        session_id text NOT NULL,
        model text NOT NULL,
        seq bigint NOT NULL,
        available_from bigint NOT NULL,
        embedding vector NOT NULL,
        PRIMARY KEY (tenant_id, session_id, model, seq)
    );
    ALTER TABLE {S}.event_embeddings ENABLE ROW LEVEL SECURITY;
    ALTER TABLE {S}.event_embeddings FORCE ROW LEVEL SECURITY;
    CREATE POLICY tenant_isolation ON {S}.event_embeddings
        USING (tenant_id = {S}.current_tenant()) WITH CHECK (tenant_id = {S}.current_tenant());
    IF EXISTS (SELECT FROM pg_roles WHERE rolname = 'contextledger_service') THEN
        GRANT SELECT, INSERT, UPDATE, DELETE ON {S}.event_embeddings TO contextledger_service;
    END IF;
END $$"""
DISTRIBUTE_EMBEDDINGS = f"""
SELECT create_distributed_table('{S}.event_embeddings', 'session_id',
                                colocate_with => '{S}.sessions')
 WHERE NOT EXISTS (SELECT 1 FROM pg_dist_partition
                    WHERE logicalrelid = '{S}.event_embeddings'::regclass)"""
#: (Each statement names its rows by key: a table made during a run has no statistics, and
#: estimated at one row a join or anti-join was planned as a rescan per row, 50-90 ms at
#: 600 messages. ``OFFSET 0`` keeps the lookup a keyed one per event.)
UNEMBEDDED = f"""
SELECT e.seq, (e.data -> 'message')::text FROM {S}.events e
 WHERE {{branch}}
   AND NOT EXISTS (SELECT 1 FROM {S}.event_embeddings x
                    WHERE x.tenant_id = {S}.current_tenant() AND x.session_id = $1
                      AND x.model = $model AND x.seq = e.seq OFFSET 0)
 ORDER BY e.seq = ANY($first::bigint[]) DESC, e.seq DESC LIMIT $limit"""
#: Only a message event is embedded, so the branch is the postings' predicate on the seq
#: (``_POSTING_ON_BRANCH``): one scan of the session's vectors, no join.
VECTOR_SEARCH = f"""
WITH q AS (
    SELECT embedding FROM {S}.event_embeddings
     WHERE tenant_id = {S}.current_tenant() AND session_id = $1 AND model = $model
       AND seq = $query_seq AND available_from <= $upto
)
SELECT x.seq, x.embedding <=> q.embedding AS distance
  FROM {S}.event_embeddings x, q
 WHERE x.tenant_id = {S}.current_tenant() AND x.session_id = $1 AND x.model = $model
   AND x.seq <= $upto AND x.available_from <= $upto
   AND NOT (SELECT $exclude::text::int8multirange) @> x.seq AND {{branch}}
 ORDER BY distance, x.seq DESC LIMIT $limit"""
#: Each vector where the event at its seq still holds the message embedded (a session
#: purged and made again under its id meanwhile holds others: their vectors are not these).
INSERT_EMBEDDING = f"""
INSERT INTO {S}.event_embeddings (session_id, model, seq, available_from, embedding)
SELECT $1, $2, e.seq, $4, u.embedding::vector
  FROM unnest($3::bigint[], $5::text[], $6::text[]) AS u(seq, message, embedding)
  JOIN {S}.events e
    ON e.tenant_id = {S}.current_tenant() AND e.session_id = $1 AND e.seq = u.seq
   AND e.type = 'message.appended' AND e.data -> 'message' = u.message::jsonb
ON CONFLICT DO NOTHING"""
HEAD_FOR_SHARE = f"""
SELECT head FROM {S}.sessions
 WHERE session_id = $1 AND tenant_id = {S}.current_tenant() FOR SHARE"""


def _embedding_args(
    session_id: str,
    model: str,
    available_from: int,
    vectors: Sequence[tuple[Recalled, Sequence[float]]],
) -> tuple[Any, ...]:
    return (
        session_id,
        model,
        [r.seq for r, _ in vectors],
        available_from,
        [dumps(r.message) for r, _ in vectors],  # (as stored: no \u escapes)
        ["[" + ",".join(map(repr, vec)) + "]" for _, vec in vectors],
    )


class Vectors(Lineages):
    """Embeddings stored and searched next to the events."""

    _vectors: bool | None

    @translated
    async def vectors_available(self) -> bool:
        if self._vectors is None:
            try:
                async with self._pool.acquire() as conn, conn.transaction():
                    await conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
                    await conn.execute(EMBEDDINGS_DDL)
                    if self.citus is not None:  # co-located with its session, as 0014's
                        await conn.execute(DISTRIBUTE_EMBEDDINGS)
                self._vectors = True
            except asyncpg.PostgresError as exc:  # no pgvector here (PG 15), or no right
                log.info("recall_vectors_unavailable", error=str(exc))
                self._vectors = False
        return self._vectors

    @translated
    async def unembedded(
        self, session_id: str, model: str, *, upto_seq: int, first: Collection[int], limit: int
    ) -> list[Recalled]:
        if await self._sealer(session_id) is not None:
            return []  # a sealed session's messages are not embedded (docs: erase-and-retention)
        sql, args = bind(
            UNEMBEDDED.format(branch=_ON_BRANCH),
            {"model": model, "upto": upto_seq, "first": sorted(first), "limit": limit},
            session_id,
        )
        rows = await self._pool.fetch(sql, *args)
        return [Recalled(r[0], json.loads(r[1])) for r in rows]

    @translated
    async def store_embeddings(
        self,
        session_id: str,
        model: str,
        available_from: int,
        vectors: Sequence[tuple[Recalled, Sequence[float]]],
    ) -> None:
        if not vectors:
            return
        await self._pool.execute(
            INSERT_EMBEDDING, *_embedding_args(session_id, model, available_from, vectors)
        )

    @translated
    async def store_embeddings_behind(
        self, session_id: str, model: str, vectors: Sequence[tuple[Recalled, Sequence[float]]]
    ) -> bool:
        async with self._pool.acquire() as conn, conn.transaction():
            # FOR SHARE: an append's conditional head UPDATE waits for this commit, so no
            # request is built at head + 1 before these rows are there to be seen
            head = await conn.fetchval(HEAD_FOR_SHARE, session_id)
            if head is None:
                return False  # purged meanwhile: nothing to embed for
            await conn.execute(
                INSERT_EMBEDDING, *_embedding_args(session_id, model, head + 1, vectors)
            )
        return True

    @translated
    async def branch_base(self, session_id: str) -> int:
        base = await self._pool.fetchval(
            f"SELECT branch_base FROM {S}.sessions"
            f" WHERE session_id = $1 AND tenant_id = {S}.current_tenant()",
            session_id,
        )
        return int(base or 0)

    @translated
    async def vector_search(
        self,
        session_id: str,
        model: str,
        query_seq: int,
        *,
        exclude: Collection[int],
        upto_seq: int,
        branch: Collection[int] | None,
        limit: int,
    ) -> list[tuple[int, float]]:
        values: dict[str, Any] = {
            "model": model,
            "upto": upto_seq,
            "exclude": seq_ranges(exclude),
            "query_seq": query_seq,
            "limit": limit,
        }
        on_branch = (_POSTING_ON_BRANCH, _POSTING_ON_GIVEN_BRANCH)
        rows = await self._fetch_on_branch(VECTOR_SEARCH, values, session_id, branch, on_branch)
        return [(r[0], float(r[1])) for r in rows]

    @translated
    async def recall_messages(
        self,
        session_id: str,
        seqs: Collection[int],
        *,
        upto_seq: int,
        branch: Collection[int] | None,
    ) -> list[Recalled]:
        if not seqs:
            return []
        lineage = await self._lineage(session_id)
        # (owner, seqs, upto, branch): each seq read from the session of the lineage holding
        # it, by that session's own id with its part of the branch (read by the fork's id
        # again, the fork's own part would follow the lineage without end)
        parts: list[tuple[str, list[int], int, Collection[int] | None]]
        if lineage:
            on = (
                set(branch)
                if branch is not None
                else await self._fork_branch_seqs(session_id, lineage)
            )
            parts = [
                (owner, [q for q in seqs if lo <= q <= hi], hi, [q for q in on if lo <= q <= hi])
                for owner, lo, hi in segments(session_id, lineage, 1, upto_seq)
            ]
        else:
            parts = [(session_id, list(seqs), upto_seq, branch)]
        out: list[Recalled] = []
        for owner, part, upto, on_branch in parts:
            if part:
                sealer = await self._sealer(owner, fresh=True)
                values: dict[str, Any] = {"seqs": sorted(part), "upto": upto}
                rows = await self._fetch_on_branch(RECALL_MESSAGES, values, owner, on_branch)
                out += [
                    Recalled(r[0], _opened(r[0], json.loads(r[1]), sealer), r[2], r[3])
                    for r in rows
                ]
        return out

    async def _fetch_on_branch(
        self,
        template: str,
        values: dict[str, Any],
        session_id: str,
        branch: Collection[int] | None,
        predicates: tuple[str, str] = (_ON_BRANCH, _ON_GIVEN_BRANCH),
    ) -> list[asyncpg.Record]:
        """``template``'s rows on the session's live branch, or on ``branch`` (a replay's
        seqs, bound as ranges into ``values``); ``predicates``: the two branch predicates
        (of events ``e``, or of another table's ``x.seq``)."""
        live, given = predicates
        if branch is None:
            sql = template.format(branch=live)
        else:
            sql = template.format(branch=given)
            values["branch"] = seq_ranges(branch)
        text, args = bind(sql, values, session_id)
        rows: list[asyncpg.Record] = await self._pool.fetch(text, *args)
        return rows
