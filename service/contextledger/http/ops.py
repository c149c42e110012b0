"""Operations: liveness, readiness (database reachable, schema current), Prometheus."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

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
    return Response(request.app.state.metrics.render(), media_type=CONTENT_TYPE_LATEST)
