"""Docs that run: every code block of the README and of ``docs/`` does what it shows.

A Python block is a complete program and runs as written (as ``__main__``, in a namespace
of its own; the consecutive blocks of a page share one interpreter, to pay its start once),
against this test's fresh PostgreSQL database (``CONTEXTLEDGER_DSN``) and the test LLM
server (``OPENAI_BASE_URL``, which litellm, the OpenAI SDK, the Agents SDK, pydantic-ai
and langchain-openai all read), with the service running when a block talks to it
(``CONTEXTLEDGER_URL``). The blocks of one page run in order against one database, so a
shell block may read what a Python block above it wrote. Shell blocks run when marked
``<!-- docs-example: run -->``; a Python block that cannot run here is marked
``<!-- docs-example: compile-only REASON -->`` and must still compile and name a reason.

Static checks over every Python block (no database): it compiles (no top-level
``await``), pyflakes finds no undefined or unused name, its strings are ASCII (a
non-ASCII API key crashes httpx), and no two blocks share a session id (two examples on
one session read each other's history).
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.fakellm import FakeLLM

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
BLOCK = re.compile(
    r"^(?:<!-- docs-example: (?P<mark>[^\n]*?) -->\n)?```(?P<lang>[a-z]*)\n(?P<code>.*?)^```",
    re.M | re.S,
)
#: How a session id is written in the examples: ledger.session("id", ...), an adapter's
#: first argument, ADK's session_id=..., LangGraph's thread_id, the proxy's header.
SESSION_ID = re.compile(
    r"""(?:\.session\(|LedgerSession\(|LedgerChatMessageHistory\(|LedgerHistory\(|"""
    r"""session_id=|"thread_id":\s*|"X-Session-Id":\s*)\s*"([^"]+)\"""",
)
TIMEOUT_S = 240


@dataclass(frozen=True)
class Block:
    page: Path
    line: int
    lang: str
    mark: str
    code: str

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    text = page.read_text()
    return [
        Block(page, text.count("\n", 0, m.start()) + 1, m["lang"], m["mark"] or "", m["code"])
        for m in BLOCK.finditer(text)
    ]


ALL = [b for page in PAGES for b in blocks(page)]
PYTHON = [b for b in ALL if b.lang == "python"]


def _runs(block: Block) -> bool:
    if block.lang == "python":
        return not block.mark.startswith("compile-only")
    return block.lang == "bash" and block.mark == "run"


RUNNABLE_PAGES = sorted({b.page for b in ALL if _runs(b)})


# ------------------------------------------------------------------ static checks


def test_the_docs_have_examples_to_run() -> None:
    assert len([b for b in PYTHON if _runs(b)]) >= 15
    assert any(b.lang == "bash" and _runs(b) for b in ALL)


@pytest.mark.parametrize("block", PYTHON, ids=[b.where for b in PYTHON])
def test_a_python_block_is_a_complete_program(block: Block) -> None:
    compile(block.code, block.where, "exec")  # top-level await is a SyntaxError here
    assert block.code.isascii(), f"{block.where}: non-ASCII in the code (keys go in headers)"
    if block.mark.startswith("compile-only"):
        reason = block.mark.removeprefix("compile-only").strip()
        assert len(reason) > 10, f"{block.where}: say why the block cannot run"
    elif "await " in block.code or "async with" in block.code:
        assert "asyncio.run(" in block.code, f"{block.where}: async code needs asyncio.run"


def test_pyflakes_finds_no_undefined_or_unused_name(tmp_path: Path) -> None:
    files = []
    for n, block in enumerate(PYTHON):
        path = tmp_path / f"block_{n}.py"
        path.write_text(block.code)
        files.append((path, block))
    done = subprocess.run(
        [
            str(Path(sys.executable).with_name("ruff")),
            "check",
            "--no-cache",
            "--isolated",
            "--select",
            "F",
            "--output-format",
            "concise",
            *[str(p) for p, _ in files],
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    found = done.stdout
    for path, block in files:
        found = found.replace(str(path), block.where)
    assert done.returncode == 0, found


def test_no_two_examples_share_a_session_id() -> None:
    seen: dict[str, str] = {}
    for block in PYTHON:
        for session_id in set(SESSION_ID.findall(block.code)):
            assert session_id not in seen, (
                f"{block.where} and {seen[session_id]} both use session {session_id!r}"
            )
            seen[session_id] = block.where
    assert len(seen) >= 15


def test_every_command_a_shell_block_names_exists() -> None:
    """A shell block that is not run still names real commands (``contextledger X``)."""
    from contextledger.cli import main

    named = 0
    for block in (b for b in ALL if b.lang == "bash"):
        for line in block.code.splitlines():
            words = line.split("#", 1)[0].split()
            if not words or words[0] not in ("contextledger", "ops/contextledger"):
                continue
            rest = iter(words[1:])
            for word in rest:
                if word in ("--dsn", "--home", "--tenant", "--log-format"):
                    next(rest, None)  # the option's value
                elif not word.startswith("-"):
                    assert word in main.commands, f"{block.where}: no command {word!r}"
                    named += 1
                    break
    assert named >= 10


# ------------------------------------------------------------------ they run


def _env(dsn: str, fake: FakeLLM, service_url: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONTEXTLEDGER_")}
    env.update(
        CONTEXTLEDGER_DSN=dsn,
        OPENAI_BASE_URL=fake.base_url,
        OPENAI_API_BASE=fake.base_url,
        OPENAI_API_KEY="test-key",
        OPENAI_AGENTS_DISABLE_TRACING="1",  # the Agents SDK exports traces otherwise
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
    )
    if service_url:
        env["CONTEXTLEDGER_URL"] = service_url
    return env


#: Runs a page's consecutive Python blocks one after the other in one interpreter, each as
#: ``__main__`` in a namespace of its own: a program as written, without paying the
#: interpreter's and litellm's start (~3-5 s) once per block.
RUNNER = """
import runpy, sys
for path in sys.argv[1:]:
    runpy.run_path(path, run_name="__main__")
"""


async def _run(group: list[Block], env: dict[str, str], cwd: Path) -> None:
    """One shell block, or a run of consecutive Python blocks, in a process."""
    if group[0].lang == "python":
        files = []
        for block in group:
            name = block.where.replace("/", "_").replace(".md:", "_md_line_")
            path = cwd / f"{name}.py"
            path.write_text(block.code)
            files.append(str(path))
        argv = [sys.executable, "-c", RUNNER, *files]
    else:
        argv = ["bash", "-euo", "pipefail", "-c", group[0].code]
    where = ", ".join(b.where for b in group)
    proc = await asyncio.create_subprocess_exec(
        *argv, cwd=cwd, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), TIMEOUT_S)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise AssertionError(f"{where} ran over {TIMEOUT_S} s") from None
    assert proc.returncode == 0, (
        f"{where} exited {proc.returncode}\n--- stdout\n{out.decode()[-3000:]}"
        f"\n--- stderr\n{err.decode()[-3000:]}"
    )


def _groups(runnable: list[Block]) -> list[list[Block]]:
    groups: list[list[Block]] = []
    for block in runnable:
        if block.lang == "python" and groups and groups[-1][0].lang == "python":
            groups[-1].append(block)
        else:
            groups.append([block])
    return groups


@asynccontextmanager
async def _service(dsn: str, fake: FakeLLM, needed: bool) -> AsyncIterator[str | None]:
    if not needed:
        yield None
        return
    from tests.integration.service_support import proxy_service

    async with proxy_service(dsn, fake, True) as svc:
        yield svc.url


@pytest.mark.slow
@pytest.mark.parametrize(
    "page", RUNNABLE_PAGES, ids=[str(p.relative_to(ROOT)) for p in RUNNABLE_PAGES]
)
async def test_the_examples_of_a_page_run(
    page: Path, pg_dsn: str, fake: FakeLLM, tmp_path: Path
) -> None:
    dsn = pg_dsn
    runnable = [b for b in blocks(page) if _runs(b)]
    needs_service = any("CONTEXTLEDGER_URL" in b.code for b in runnable)
    async with _service(dsn, fake, needs_service) as url:
        env = _env(dsn, fake, url)
        for group in _groups(runnable):
            await _run(group, env, tmp_path)
