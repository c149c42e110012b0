"""Debian packages the tests need (chromium, pgbouncer), installed when missing: with apt
as root, one install at a time across parallel suites, waiting for a dpkg lock another
apt holds. Where that is impossible the test fails loudly (never skips)."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
from pathlib import Path

import pytest


def ensure_package(binary: Path, package: str) -> str:
    """The path of ``binary``, installing Debian's ``package`` first if it is missing."""
    if binary.is_file():
        return str(binary)
    apt = shutil.which("apt-get")
    if apt is None or os.geteuid() != 0:
        pytest.fail(
            f"this test needs Debian's {package} at {binary}; install it with "
            f"`apt-get install -y {package}` (this machine has no apt-get or we are not root)"
        )
    with open(f"/tmp/contextledger-apt-{package}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # parallel suites: one apt at a time
        if not binary.is_file():
            env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
            wait = ["-o", "DPkg::Lock::Timeout=600"]  # another apt/dpkg may hold the lock
            for cmd in (
                [apt, *wait, "update", "-qq"],
                [apt, *wait, "install", "-y", "-qq", package],
            ):
                done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
                if done.returncode != 0:
                    pytest.fail(f"{' '.join(cmd)} failed:\n{done.stderr[-2000:]}")
    if not binary.is_file():
        pytest.fail(f"apt installed {package} but {binary} is missing")
    return str(binary)
