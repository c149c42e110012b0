"""Where benchmarks leave their figures: ``bench/results/NAME.json``, with date and commit,
so the docs quote a run, not a memory of one."""

from __future__ import annotations

import datetime as dt
import json
import subprocess
from pathlib import Path
from typing import Any

DIR = Path(__file__).resolve().parent / "results"


def commit() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
            cwd=DIR.parent,
        )
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            cwd=DIR.parent,
        ).stdout.strip()
        return out.stdout.strip() + ("+changes" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def write(name: str, figures: dict[str, Any]) -> Path:
    """Write ``figures`` with the date and commit to ``bench/results/NAME.json``."""
    DIR.mkdir(exist_ok=True)
    path = DIR / f"{name}.json"
    doc = {"bench": name, "date": dt.date.today().isoformat(), "commit": commit(), **figures}
    path.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    return path
