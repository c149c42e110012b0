"""Frameworks are optional: ``import contextledger`` never imports one, and an adapter
whose extra is missing says which ``pip install`` adds it."""

from __future__ import annotations

import subprocess
import sys

import pytest

FRAMEWORKS = ("agents", "pydantic_ai", "google.adk", "langchain_core", "langgraph")


def _run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )


def test_importing_contextledger_imports_no_framework() -> None:
    done = _run(
        "import sys, contextledger, contextledger.adapters\n"
        f"print(sorted(m for m in {FRAMEWORKS!r} if m in sys.modules))"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


@pytest.mark.parametrize(
    ("module", "blocked", "extra"),
    [
        ("contextledger.adapters.openai_agents", "agents", "openai-agents"),
        ("contextledger.adapters.pydantic_ai", "pydantic_ai", "pydantic-ai"),
    ],
)
def test_a_missing_extra_names_its_pip_install(module: str, blocked: str, extra: str) -> None:
    done = _run(
        "import sys\n"
        f"sys.modules[{blocked!r}] = None  # as if not installed\n"
        "from contextledger import MissingExtra\n"
        "try:\n"
        f"    import {module}\n"
        "except MissingExtra as exc:\n"
        "    print(exc.code, exc.details['extra'], str(exc))\n"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"MISSING_EXTRA {extra} ")
    assert f"pip install 'contextledger-pg[{extra}]'" in done.stdout


def test_the_command_without_its_extra_says_what_to_install_in_one_line() -> None:
    done = _run(
        "import sys\n"
        "sys.modules['rich'] = None  # as if not installed\n"
        "from contextledger.cli_entry import main\n"
        "main()\n"
    )
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines() == [
        "contextledger: [MISSING_EXTRA] the contextledger command line needs rich, which"
        " is not installed: pip install 'contextledger-pg[cli]' (or 'contextledger-pg[all]')"
    ]
