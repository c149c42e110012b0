"""Debian's chromium for the browser tests, installed when missing.

Playwright cannot download its own browsers here, so the tests drive the system
chromium. On a machine without it, it is installed with apt when we are root;
where that is impossible the test fails loudly (never skips).
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
from pathlib import Path

import pytest

CHROMIUM = Path("/usr/bin/chromium")


def ensure_chromium() -> str:
    if CHROMIUM.is_file():
        return str(CHROMIUM)
    apt = shutil.which("apt-get")
    if apt is None or os.geteuid() != 0:
        pytest.fail(
            "the browser test needs Debian's chromium at /usr/bin/chromium; install it with "
            "`apt-get install -y chromium` (this machine has no apt-get or we are not root)"
        )
    with open("/tmp/contextledger-chromium.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # xdist workers or parallel suites: one apt at a time
        if not CHROMIUM.is_file():
            env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
            for cmd in ([apt, "update", "-qq"], [apt, "install", "-y", "-qq", "chromium"]):
                done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
                if done.returncode != 0:
                    pytest.fail(f"{' '.join(cmd)} failed:\n{done.stderr[-2000:]}")
    if not CHROMIUM.is_file():
        pytest.fail("apt installed chromium but /usr/bin/chromium is missing")
    return str(CHROMIUM)
