"""The floor under the service's appends: the library's ``Session.add_message`` behind a
bare ASGI app on the service's own server stack (uvicorn, uvloop, ``OneWriteHttp``), with
no framework, no checks, no log line and no metrics.

``bench/service.py --floor`` runs it as a third side, paired with the service: the
service's CPU per append above this is what its HTTP layer costs (routing, the guard,
the key, validation, the access log, metrics); below it nothing HTTP can go. It serves
only what the bench sends: ``POST /v1/sessions`` (``{"session_id"}``),
``POST /v1/sessions/{id}/messages`` (``{"message"}``) and ``GET /readyz``.

    python -m bench.service_floor DSN PORT WORKERS [--pgbouncer]
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from contextledger import Ledger, Session

DSN_ENV = "CONTEXTLEDGER_FLOOR_DSN"
PGBOUNCER_ENV = "CONTEXTLEDGER_FLOOR_PGBOUNCER"


class Floor:
    """One process's ledger and session handles (each worker has its own)."""

    def __init__(self) -> None:
        self.ledger: Ledger | None = None
        self.opened: Any = None
        self.sessions: dict[str, Session] = {}

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await self.lifespan(receive, send)
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        path = scope["path"]
        assert self.ledger is not None
        if scope["method"] == "GET":
            await answer(send, 200, b"{}")
        elif path == "/v1/sessions":
            await self.ledger.session(json.loads(body)["session_id"], create=True)
            await answer(send, 201, b"{}")
        else:
            session_id = path.split("/")[3]
            session = self.sessions.get(session_id)
            if session is None:
                session = self.sessions[session_id] = await self.ledger.session(session_id)
            seq = await session.add_message(json.loads(body)["message"])
            await answer(send, 201, b'{"seqs":[%d],"head":%d}' % (seq, seq))

    async def lifespan(self, receive: Any, send: Any) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                self.opened = Ledger.open(
                    os.environ[DSN_ENV],
                    pool_size=16,
                    migrate=False,  # the bench migrated it
                    pgbouncer=os.environ[PGBOUNCER_ENV] == "1",
                )
                self.ledger = await self.opened.__aenter__()
                await send({"type": "lifespan.startup.complete"})
            else:
                await self.opened.__aexit__(None, None, None)
                await send({"type": "lifespan.shutdown.complete"})
                return


async def answer(send: Any, status: int, body: bytes) -> None:
    headers = [(b"content-length", b"%d" % len(body)), (b"content-type", b"application/json")]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


app = Floor()


def main() -> None:
    import uvicorn

    from contextledger.http.protocol import OneWriteHttp

    dsn, port, workers = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    os.environ[DSN_ENV] = dsn
    os.environ[PGBOUNCER_ENV] = "1" if "--pgbouncer" in sys.argv else "0"
    uvicorn.run(
        "bench.service_floor:app",
        host="127.0.0.1",
        port=port,
        workers=workers,
        loop="uvloop",
        http=OneWriteHttp,
        lifespan="on",
        access_log=False,
        log_config=None,
    )


if __name__ == "__main__":
    main()
