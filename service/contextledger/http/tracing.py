"""The caller's W3C trace context (``traceparent``, ``tracestate``) as the parent of the
spans a request makes (``contextledger.telemetry``): one trace from the agent, through
the service, to the ledger's ``create_memory`` / ``search_memory`` spans.

Pure ASGI, outermost. With no tracer provider configured it only passes the request on.
The propagator validates the header (a malformed one starts a new trace); an oversized
one is ignored before it is parsed.
"""

from __future__ import annotations

from typing import Any

from contextledger import telemetry

#: The W3C headers read (lower case, as ASGI gives them) and the longest value taken.
HEADERS = (b"traceparent", b"tracestate")
MAX_HEADER = 1024


class TraceContext:
    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or not telemetry.active():
            await self.app(scope, receive, send)
            return
        carrier = {
            name.decode("latin-1"): value.decode("latin-1")
            for name, value in scope.get("headers") or ()
            if name in HEADERS and len(value) <= MAX_HEADER
        }
        if "traceparent" not in carrier:
            await self.app(scope, receive, send)
            return
        from opentelemetry import context, propagate

        token = context.attach(propagate.extract(carrier))
        try:
            await self.app(scope, receive, send)
        finally:
            context.detach(token)
