"""Debian's chromium for the browser tests, installed when missing.

Playwright cannot download its own browsers here, so the tests drive the system
chromium. On a machine without it, it is installed with apt when we are root;
where that is impossible the test fails loudly (never skips).
"""

from __future__ import annotations

from pathlib import Path

from tests.integration.debian import ensure_package

CHROMIUM = Path("/usr/bin/chromium")


def ensure_chromium() -> str:
    return ensure_package(CHROMIUM, "chromium")
