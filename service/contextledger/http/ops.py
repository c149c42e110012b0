"""Operations: liveness, readiness (database reachable, schema current), Prometheus."""

from __future__ import annotations

import hmac

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from contextledger.http.problems import Problem

router = APIRouter(tags=["operations"])


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    """The process is up (says nothing about the database)."""
    return {"status": "ok"}


@router.get("/readyz", response_model=None)
async def readyz(request: Request) -> JSONResponse:
    """Ready to serve: the database answers and its schema is the code's."""
    ok, detail = await request.app.state.tenants.ready()
    if request.app.state.stopping.is_set():
        ok, detail = False, "shutting down"
    return JSONResponse(
        {"status": "ready" if ok else "unavailable", "detail": detail},
        status_code=200 if ok else 503,
    )


@router.get("/metrics", response_model=None)
async def metrics(request: Request) -> Response:
    """Prometheus metrics: with ``metrics_token`` set, for its bearer only; without one,
    only from a service bound to loopback (the metrics name every tenant)."""
    settings = request.app.state.settings
    token = settings.metrics_token
    if token:
        auth = request.headers.get("authorization", "")
        given = auth[7:].strip() if auth[:7].lower() == "bearer " else ""
        if not hmac.compare_digest(given.encode(), token.encode()):
            raise Problem(401, "UNAUTHORIZED", "/metrics needs the metrics token (metrics_token)")
    elif not settings.local_only:
        raise Problem(
            403,
            "METRICS_TOKEN_REQUIRED",
            "set metrics_token to serve /metrics from a service bound beyond loopback",
        )
    return Response(request.app.state.metrics.render(), media_type=CONTENT_TYPE_LATEST)
