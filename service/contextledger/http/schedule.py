"""The service's scheduled work: retention policies per tenant (``Settings.retention``).

Every worker process runs the schedule; the actions are idempotent (an erased session
is not erased again, a purged one is gone), so two workers at once do no harm.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

import structlog

from contextledger import retention
from contextledger.http.tenancy import Tenants

log = structlog.get_logger(__name__)


def policies_of(
    configured: Mapping[str, Mapping[str, int]],
) -> dict[str, retention.RetentionPolicy]:
    """The settings' policies, validated (``ConfigError`` at start, not at the first run)."""
    return {t: retention.RetentionPolicy.from_mapping(p) for t, p in configured.items()}


async def apply_once(tenants: Tenants, policies: Mapping[str, retention.RetentionPolicy]) -> int:
    """One pass over every tenant's policy; the number of sessions acted on."""
    acted = 0
    for tenant, policy in policies.items():
        try:
            ledger = await tenants.ledger(tenant)
            for a in await retention.apply(ledger, policy):
                tenants.forget(tenant, a.session_id)
                log.info(
                    "retention_applied",
                    tenant=tenant,
                    session_id=a.session_id,
                    action=a.action,
                    why=a.why,
                )
                acted += a.done
        except Exception as exc:  # one tenant's failure does not stop the others
            log.warning("retention_failed", tenant=tenant, error=str(exc))
    return acted


async def run_retention(
    tenants: Tenants,
    policies: Mapping[str, retention.RetentionPolicy],
    interval: float,
    stopping: asyncio.Event,
) -> None:
    """Apply the policies now and then every ``interval`` seconds until ``stopping``."""
    while not stopping.is_set():
        await apply_once(tenants, policies)
        try:
            await asyncio.wait_for(stopping.wait(), interval)
        except TimeoutError:
            continue
