"""The ``contextledger`` command's entry point. Without the ``cli`` extra installed it says
in one line which extra to install, where importing the CLI itself would end in a traceback."""

from __future__ import annotations

import sys

from contextledger.errors import MissingExtra


def main() -> None:
    """Run the command line (``contextledger.cli``)."""
    try:
        from contextledger.cli import main as command
    except MissingExtra as exc:
        sys.exit(f"contextledger: {exc}")
    command()
