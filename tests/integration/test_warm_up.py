"""``contextledger.warm_up``: after it, a process's first session and request do no
first-use work on the event loop (issue 28, "first hour": no stall over 50 ms).

What stalls a loop at first use is one-time work that holds the GIL: building a tiktoken
encoding (~0.1-0.4 s) and importing modules (bm25s and numpy ~0.5 s, PyStemmer,
opentelemetry). The test checks that work directly rather than timing the loop (a
lateness probe read 52-129 ms on a loaded CI machine for a warm process whose first use
did none of it): in a fresh process (the caches are per process) it records which
modules get imported and which encodings get built during the first session's calls.
After ``warm_up``: none. Without it: the tokenizer and recall's lexer load right there,
which a lateness probe measured as a 0.1-0.5 s stall."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

PROBE = """
import asyncio, json, sys
import contextledger
from contextledger import Ledger
from contextledger.core import tokens

async def main(dsn, model, warm):
    if warm == "warm":
        await contextledger.warm_up(model)
    async with Ledger.open(dsn) as ledger:
        modules, encodings = set(sys.modules), set(tokens._encodings)
        session = await ledger.session("warm-" + warm, model=model)
        await session.add_message({"role": "user", "content": "how long is a piece of string?"})
        await session.get_messages_for_request()
        await session.usage()
        print(json.dumps({
            "imported": sorted(set(sys.modules) - modules),
            "built": sorted(set(tokens._encodings) - encodings),
        }))

asyncio.run(main(*sys.argv[1:]))
"""


def _first_use(dsn: str, model: str, warm: str) -> dict[str, list[str]]:
    """What the first session's calls imported and built, in a fresh process."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONTEXTLEDGER_")}
    done = subprocess.run(
        [sys.executable, "-c", PROBE, dsn, model, warm],
        capture_output=True,
        text=True,
        env=env,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    found: dict[str, list[str]] = json.loads(done.stdout.strip().splitlines()[-1])
    return found


@pytest.mark.parametrize("model", ["gpt-4o", "claude-sonnet-4-20250514"])
def test_after_warm_up_the_first_session_loads_nothing(pg_dsn: str, model: str) -> None:
    assert _first_use(pg_dsn, model, "warm") == {"imported": [], "built": []}


def test_after_warm_up_a_memory_session_loads_nothing() -> None:
    """memory:// too: its recall index tokenizes with bm25s (numpy), which warm_up loads."""
    assert _first_use("memory://", "gpt-4o", "warm") == {"imported": [], "built": []}


def test_without_warm_up_the_first_session_loads_the_tokenizer(pg_dsn: str) -> None:
    """The probe sees the first-use work warm_up exists for (so the tests above can fail)."""
    cold = _first_use(pg_dsn, "gpt-4o", "cold")
    assert cold["built"] == ["o200k_base"]
    assert {"tiktoken", "tiktoken_ext.openai_public"} <= set(cold["imported"])


def test_without_warm_up_a_memory_session_loads_its_lexer() -> None:
    cold = _first_use("memory://", "gpt-4o", "cold")
    assert cold["built"] == ["o200k_base"]
    assert {"bm25s.tokenization", "Stemmer"} <= set(cold["imported"])
