"""uvicorn's HTTP protocol, with a response's head and body sent in one write.

uvicorn writes the status line and headers when the app sends ``http.response.start``
and the body at ``http.response.body``: two sends for an append's 201 of a few dozen
bytes, two TCP segments, and a client woken twice (its HTTP parser reads the head,
then waits for the body). ``OneWrite`` holds a connection's write back until the next
write of the same step, which takes it along, or until the event loop's current pass
ends (``call_soon``): a response the app sends at once leaves whole; a streamed one's
head, or its last chunk, is held for that pass only.
"""

from __future__ import annotations

import asyncio
from typing import Any

try:  # what uvicorn's "auto" picks: httptools where installed, else h11
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as _Base
except ImportError:  # pragma: no cover - the service extra brings httptools
    from uvicorn.protocols.http.h11_impl import H11Protocol as _Base  # type: ignore[assignment]


class OneWrite:
    """A connection's transport whose writes in one step go out as one."""

    __slots__ = ("_held", "_loop", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._held: bytes | None = None

    def write(self, data: Any) -> None:
        if not data:
            return
        held = self._held
        if held is None:
            self._held = bytes(data)
            self._loop.call_soon(self._flush)
        else:
            self._held = None
            self._transport.write(b"".join((held, data)))

    def _flush(self) -> None:
        held = self._held
        if held is not None:
            self._held = None
            if not self._transport.is_closing():
                self._transport.write(held)

    def writelines(self, data: Any) -> None:
        self._flush()
        self._transport.writelines(data)

    def write_eof(self) -> None:
        self._flush()
        self._transport.write_eof()

    def close(self) -> None:
        self._flush()
        self._transport.close()

    def abort(self) -> None:
        self._held = None
        self._transport.abort()

    def __getattr__(self, name: str) -> Any:  # the rest of the transport, as it is
        return getattr(self._transport, name)


class OneWriteHttp(_Base):
    """uvicorn's HTTP/1.1 protocol over ``OneWrite`` (``uvicorn.Config(http=...)``)."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(OneWrite(transport, self.loop))  # type: ignore[arg-type]
