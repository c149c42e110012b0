"""Who is calling: the tenant of the presented API key, or the local tenant.

Until the first key is created the service is in local mode (one implicit
tenant, loopback only). Afterwards every API call needs a key: ``Authorization:
Bearer cl_…``, or ``X-ContextLedger-Key`` (for proxy clients whose bearer is
their own upstream key), or the audit page's ``cl_key`` cookie.
"""

from __future__ import annotations

from fastapi import Request

from contextledger.http.problems import Problem
from contextledger.http.tenancy import LOCAL_TENANT, Tenants

KEY_HEADER = "x-contextledger-key"
KEY_COOKIE = "cl_key"


def presented_key(request: Request, *, bearer_is_ours: bool = True) -> str | None:
    key = request.headers.get(KEY_HEADER)
    if key:
        return key.strip()
    auth = request.headers.get("authorization", "")
    if bearer_is_ours and auth[:7].lower() == "bearer ":
        return auth[7:].strip()
    return request.cookies.get(KEY_COOKIE)


async def tenant_for(request: Request, *, bearer_is_ours: bool = True) -> str:
    tenants: Tenants = request.app.state.tenants
    if not await tenants.keys_required():
        tenant = LOCAL_TENANT
    else:
        key = presented_key(request, bearer_is_ours=bearer_is_ours)
        found = await tenants.keys.tenant_of(key) if key and tenants.keys else None
        if found is None:
            raise Problem(401, "UNAUTHORIZED", "a valid API key is required")
        tenant = found
    request.state.tenant = tenant
    return tenant


async def current_tenant(request: Request) -> str:
    """FastAPI dependency for the REST API."""
    return await tenant_for(request)
