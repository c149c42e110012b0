"""A response leaves the service in one write (``http/protocol.py``): head and body in
one TCP segment, as the client's socket counts them (uvicorn alone sends two), whether
the lane, a FastAPI route, an error handler or the guard answered."""

from __future__ import annotations

import asyncio
import json
from typing import Any
from urllib.parse import urlsplit

from tests.integration.segments import data_segments
from tests.integration.service_support import Running


async def _exchange(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, head: str, body: bytes = b""
) -> tuple[int, Any, int]:
    """One request on the connection: (status, JSON body, data segments it came in)."""
    sock = writer.get_extra_info("socket")
    before = data_segments(sock)[0]
    writer.write(head.encode() + b"\r\n\r\n" + body)
    lines = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
    length = next(
        int(v) for k, _, v in (x.partition(":") for x in lines) if k.lower() == "content-length"
    )
    answer = json.loads(await reader.readexactly(length))
    return int(lines[0].split()[1]), answer, data_segments(sock)[0] - before


def _post(path: str, length: int, *extra: str) -> str:
    return "\r\n".join(
        [
            f"POST {path} HTTP/1.1",
            "Host: 127.0.0.1",
            "Content-Type: application/json",
            f"Content-Length: {length}",
            *extra,
        ]
    )


async def test_each_response_arrives_in_one_segment(svc: Running) -> None:
    assert (await svc.client.post("/v1/sessions", json={"session_id": "s"})).status_code == 201
    parts = urlsplit(svc.url)
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
    try:
        append = json.dumps({"message": {"role": "user", "content": "hi"}}).encode()
        for _ in range(3):  # the lane
            status, answer, segments = await _exchange(
                reader, writer, _post("/v1/sessions/s/messages", len(append)), append
            )
            assert status == 201 and "seqs" in answer
            assert segments == 1
        # an error the lane maps to a problem
        status, answer, segments = await _exchange(
            reader, writer, _post("/v1/sessions/none/messages", len(append)), append
        )
        assert (status, answer["code"], segments) == (404, "SESSION_NOT_FOUND", 1)
        # a FastAPI route
        status, answer, segments = await _exchange(
            reader, writer, "GET /v1/sessions/s HTTP/1.1\r\nHost: 127.0.0.1"
        )
        assert (status, answer["head"], segments) == (200, 4, 1)
        # the guard, before any body is read (the connection ends with it)
        too_big = _post("/v1/sessions/s/messages", 10**9, "Connection: close")
        status, answer, segments = await _exchange(reader, writer, too_big)
        assert (status, answer["code"], segments) == (413, "BODY_TOO_LARGE", 1)
    finally:
        writer.close()
