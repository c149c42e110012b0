"""Retention: erase or purge sessions idle longer than a policy allows, each action audited.

A policy is off unless given (nothing is removed by default). ``erase_after_days``
erases a sealed session (its data key destroyed, its chain kept); ``purge_after_days``
purges any session, erased or not (its events deleted; a ``purges`` row stays). A
session's age is its idleness: days since its last event, so a session in use is never
touched. A dry run (``plan``) lists what would go and why; ``apply`` does it through the
same audited paths as a person would (``Ledger.erase``, the store's ``purge``), with
the policy and the idle days in the recorded reason.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal

from contextledger.errors import ConfigError, SessionErased, SessionNotFound

if TYPE_CHECKING:
    from contextledger.ledger import Ledger
    from contextledger.store.base import SessionInfo

#: A century: beyond it a value is a typo, not a policy.
MAX_DAYS = 36_500
ACTOR = "retention"
Action = Literal["erase", "purge", "skip"]


@dataclass(frozen=True)
class RetentionPolicy:
    """How long an idle session may stay: erased after N days, purged after M (M > N)."""

    erase_after_days: int | None = None
    purge_after_days: int | None = None

    def __post_init__(self) -> None:
        for name in ("erase_after_days", "purge_after_days"):
            value = getattr(self, name)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_DAYS:
                raise ConfigError(
                    f"retention.{name} must be a whole number of days, 1..{MAX_DAYS}",
                    key=f"retention.{name}",
                )
        if self.erase_after_days is None and self.purge_after_days is None:
            raise ConfigError(
                "a retention policy needs erase_after_days or purge_after_days",
                key="retention",
            )
        if (
            self.erase_after_days is not None
            and self.purge_after_days is not None
            and self.purge_after_days <= self.erase_after_days
        ):
            raise ConfigError(
                "retention.purge_after_days must be later than erase_after_days "
                "(a purge removes what an erasure keeps)",
                key="retention.purge_after_days",
            )

    @classmethod
    def from_mapping(cls, value: Any) -> RetentionPolicy:
        """``{erase_after_days: N}`` and/or ``{purge_after_days: M}``; anything else is a
        ``ConfigError`` naming the key."""
        if not isinstance(value, Mapping):
            raise ConfigError("a retention policy is a mapping", key="retention")
        unknown = sorted(str(k) for k in value if k not in ("erase_after_days", "purge_after_days"))
        if unknown:
            raise ConfigError(
                f"unknown retention setting(s): {', '.join(unknown)} "
                "(known: erase_after_days, purge_after_days)",
                key="retention",
            )
        return cls(value.get("erase_after_days"), value.get("purge_after_days"))

    def to_dict(self) -> dict[str, int]:
        out: dict[str, int] = {}
        if self.erase_after_days is not None:
            out["erase_after_days"] = self.erase_after_days
        if self.purge_after_days is not None:
            out["purge_after_days"] = self.purge_after_days
        return out


#: The variable both the service and ``contextledger retention apply`` read.
ENV = "CONTEXTLEDGER_RETENTION"


def policies_from_json(raw: str) -> dict[str, RetentionPolicy]:
    """``{"tenant": {"erase_after_days": N, "purge_after_days": M}, ...}`` (JSON), each
    policy validated; the embedded/local ledger's tenant is ``local``."""
    try:
        loaded = json.loads(raw) if raw.strip() else {}
    except ValueError:
        raise ConfigError(f"${ENV} is not JSON", key="retention") from None
    if not isinstance(loaded, Mapping):
        raise ConfigError(
            f"${ENV} is a JSON object: tenant -> policy, e.g. "
            '{"local": {"erase_after_days": 30}}',
            key="retention",
        )
    return {str(t): RetentionPolicy.from_mapping(p) for t, p in loaded.items()}


@dataclass(frozen=True)
class RetentionAction:
    """What the policy does (or, in a dry run, would do) to one session, and why."""

    session_id: str
    action: Action
    idle_days: float
    last_activity: datetime
    why: str
    #: False in a dry run, and for a skip; True once done.
    done: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "session_id": self.session_id,
            "action": self.action,
            "idle_days": round(self.idle_days, 2),
            "last_activity": self.last_activity.isoformat(),
            "why": self.why,
            "done": self.done,
        }


def decide(
    policy: RetentionPolicy, *, idle_days: float, erased: bool, sealed: bool
) -> tuple[Action, str] | None:
    """What ``policy`` does to a session idle ``idle_days`` (None: nothing). Pure."""
    purge, erase = policy.purge_after_days, policy.erase_after_days
    if purge is not None and idle_days >= purge:
        return "purge", f"retention: purge_after_days={purge}, idle {idle_days:.1f} days"
    if erase is not None and idle_days >= erase and not erased:
        if not sealed:
            return "skip", (
                f"erase_after_days={erase} applies, but the session was written without a "
                "data key: it cannot be erased (set purge_after_days to remove it)"
            )
        return "erase", f"retention: erase_after_days={erase}, idle {idle_days:.1f} days"
    return None


async def plan(
    ledger: Ledger, policy: RetentionPolicy, *, now: datetime | None = None
) -> list[RetentionAction]:
    """The dry run: every session the policy would act on, longest idle first.

    A session with forks is as idle as the least idle of them (and of theirs): its
    content is their prefix, an erasure of it takes them with it, and a purge of it
    is refused while they stand. Among sessions idle alike, a fork comes before what
    it stands on (a purge goes leaf first)."""
    now = now or datetime.now(UTC)
    await _one_tenant(ledger)
    infos: dict[str, SessionInfo] = {}
    last: dict[str, datetime] = {}
    after: tuple[datetime, str] | None = None
    while True:
        page = await ledger.store.list_sessions(after=after, limit=500)
        for info in page:
            try:
                tail = [e async for e in ledger.store.stored_events(info.session_id, info.head)]
            except SessionNotFound:
                continue  # purged meanwhile
            if tail:
                infos[info.session_id] = info
                last[info.session_id] = tail[-1].created_at
        if len(page) < 500:
            break
        after = (page[-1].created_at, page[-1].session_id)
    depth = {sid: _depth(sid, infos) for sid in infos}
    used = dict(last)  # a session's last activity, its forks' included
    for sid in sorted(infos, key=lambda s: -depth[s]):  # the deepest forks first
        parent = infos[sid].parent
        if parent is not None and parent[0] in used:
            used[parent[0]] = max(used[parent[0]], used[sid])
    out: list[RetentionAction] = []
    for sid, info in infos.items():
        at = used[sid]
        idle = (now - at).total_seconds() / 86_400
        verdict = decide(
            policy, idle_days=idle, erased=info.erased_at is not None, sealed=info.sealed
        )
        if verdict is not None:
            out.append(RetentionAction(sid, verdict[0], idle, at, verdict[1]))
    return sorted(out, key=lambda a: (a.last_activity, -depth[a.session_id], a.session_id))


async def _one_tenant(ledger: Ledger) -> None:
    """``ConfigError`` when the ledger's connections see another tenant's sessions (a
    superuser's or the tables' owner's: row-level security does not hold them). The
    policy is one tenant's; run on such a connection it listed every tenant's sessions
    and erased or purged them all under it."""
    other = getattr(ledger.store, "other_tenant", None)
    seen = await other() if other is not None else None
    if seen is not None:
        raise ConfigError(
            f"this connection sees other tenants' sessions too (tenant {seen!r}): its role "
            "is a superuser or owns the tables, so row-level security does not keep "
            "tenants apart and the policy would act on every tenant's sessions. Apply it "
            "per tenant as the service role: contextledger --dsn <DSN as "
            "contextledger_service> --tenant TENANT retention apply ...",
            key="tenant",
        )


def _depth(session_id: str, infos: Mapping[str, SessionInfo]) -> int:
    """How many forks down ``session_id`` stands (0: no fork, or its parent not listed)."""
    n = 0
    parent = infos[session_id].parent
    while parent is not None and parent[0] in infos:
        n += 1
        parent = infos[parent[0]].parent
    return n


async def apply(
    ledger: Ledger,
    policy: RetentionPolicy,
    *,
    now: datetime | None = None,
    dry_run: bool = False,
    actor: str = ACTOR,
) -> list[RetentionAction]:
    """Carry out ``plan``: each erasure and purge through the audited path, the policy and
    the idle days in its recorded reason. Idempotent: a second run finds nothing left."""
    planned = await plan(ledger, policy, now=now)
    if dry_run:
        return planned
    purge = getattr(ledger.store, "purge", None)
    done: list[RetentionAction] = []
    for item in planned:
        if item.action == "skip":
            done.append(item)
            continue
        try:
            if item.action == "erase":
                await ledger.erase(item.session_id, reason=item.why, actor=actor)
            else:
                if purge is None:
                    raise ConfigError(f"the {ledger.store.kind} store cannot purge")
                await purge(item.session_id, item.why)
        except SessionErased:
            pass  # erased meanwhile (by a person, or as a fork): what the policy wanted
        except SessionNotFound:
            continue  # purged meanwhile
        done.append(
            RetentionAction(
                item.session_id, item.action, item.idle_days, item.last_activity, item.why, True
            )
        )
    return done
