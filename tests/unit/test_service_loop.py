"""``contextledger serve`` runs on uvloop: uvicorn only picks it for loops it creates."""

from __future__ import annotations

import asyncio

import uvloop

from contextledger.http.server import loop_factory


def test_the_service_loop_is_uvloops() -> None:
    factory = loop_factory()
    assert factory is not None
    loop = factory()
    try:
        assert isinstance(loop, uvloop.Loop)
        assert loop.run_until_complete(asyncio.sleep(0, result=7)) == 7
    finally:
        loop.close()
