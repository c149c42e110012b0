"""``create_app(settings)``: the FastAPI application, its lifespan and middleware."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import structlog
from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles

from contextledger.errors import ConfigError
from contextledger.http import audit, ops, problems, proxy, rest, schedule
from contextledger.http.append_lane import AppendLane, ServiceApp
from contextledger.http.guard import Guard
from contextledger.http.lane import Lane
from contextledger.http.metrics import Metrics
from contextledger.http.settings import Settings
from contextledger.http.tenancy import Tenants
from contextledger.http.tracing import TraceContext
from contextledger.http.upstream import CONTROL, Relay
from contextledger.http.watch import Watches

access_log = structlog.get_logger("contextledger.access")
VERSION = "0.1.0"


class RequestRecords:
    """Each request's metrics and its one structured log line: method, route template,
    status, duration and tenant; never bodies, query strings or headers (keys travel in
    headers). Shared by ``AccessLog`` and the append lane, which answers in front of it."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics
        #: (method, route, status) -> the metric children: ``labels()`` resolves them
        #: under a lock per call. As many entries as the metrics' own label sets.
        self._children: dict[tuple[str, str, int], tuple[Any, Any]] = {}

    def record(self, scope: Any, status: int, started: float) -> None:
        route = getattr(scope.get("route"), "path", None) or "unmatched"
        elapsed = time.perf_counter() - started
        method = scope["method"]
        children = self._children.get((method, route, status))
        if children is None:
            children = (
                self.metrics.requests.labels(method, route, str(status)),
                self.metrics.latency.labels(method, route),
            )
            self._children[(method, route, status)] = children
        children[0].inc()
        children[1].observe(elapsed)
        state = scope.get("state") or {}
        access_log.info(
            "request",
            method=method,
            route=route,
            status=status,
            ms=round(elapsed * 1000, 2),
            tenant=state.get("tenant"),
        )


class AccessLog:
    """Pure ASGI middleware: ``RequestRecords.record`` for every HTTP request."""

    def __init__(self, app: Any, records: RequestRecords) -> None:
        self.app, self.records = app, records

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def send_status(message: Any) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            self.records.record(scope, status, started)


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or Settings.from_env()
    control = sorted(set(settings.proxy_parameters) & CONTROL)
    if control:  # refused per request anyway; said once, at the start, for the operator
        raise ConfigError(
            f"proxy_parameters cannot allow litellm's control arguments: {', '.join(control)}",
            key="proxy_parameters",
        )
    tenants = Tenants(settings)
    metrics = Metrics(tenants.pool_stats)
    tenants.on_session.append(metrics.watch)
    relay = Relay(settings)  # the proxy's client for an OpenAI-compatible upstream

    policies = schedule.policies_of(settings.retention)
    if settings.retention_interval <= 0:
        raise ConfigError("retention_interval must be > 0 seconds", key="retention_interval")

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await tenants.start()
        scheduled = (
            asyncio.create_task(
                schedule.run_retention(
                    tenants, policies, settings.retention_interval, app.state.stopping
                )
            )
            if policies
            else None
        )
        try:
            yield
        finally:
            app.state.stopping.set()
            if scheduled is not None:
                await scheduled  # a pass in progress finishes its current session
            await tenants.close()  # in-flight appends finish: each ledger waits for its own
            await relay.close()

    app = ServiceApp(
        title="contextledger",
        version=VERSION,
        summary="An LLM agent's memory as an append-only event ledger: REST, proxy, audit.",
        lifespan=lifespan,
        # The service's own /metrics and access log are its telemetry. FastAPI's native
        # OpenTelemetry (0.165+), with no provider configured, still looks the three
        # global providers up on every request: ~2.4% of an append's CPU (py-spy under
        # bench/service.py). Older FastAPI ignores the argument.
        telemetry={"tracing": False, "metrics": False, "logs": False},
    )
    app.state.settings = settings
    app.state.tenants = tenants
    app.state.metrics = metrics
    app.state.relay = relay
    app.state.stopping = asyncio.Event()
    app.state.tails = {}  # tenant -> event streams open (rest.event_stream)
    app.state.watches = Watches(rest.SSE_POLL_S, metrics.stream_polls.inc)
    problems.install(app)
    app.include_router(rest.router)
    app.include_router(proxy.router)
    app.include_router(ops.router)
    app.include_router(audit.router)
    app.mount("/static", StaticFiles(directory=audit.STATIC), name="static")
    app.add_middleware(Lane)  # inside AccessLog: its requests are logged and counted
    # before the lane and every route: size, media type, same-site, Host (http/guard.py)
    app.add_middleware(Guard, settings=settings)
    records = RequestRecords(metrics)
    app.add_middleware(AccessLog, records=records)
    app.add_middleware(TraceContext)  # outermost: the caller's trace is every span's parent
    # in front of the whole stack: the usual append (http/append_lane.py)
    app.append_lane = AppendLane(app.full_stack, Guard(None, settings), records.record)
    return app
