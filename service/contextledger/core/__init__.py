"""The pure functional core: no asyncio, database, network, logging setup or clock.

Everything here is a function of its arguments; the shell (session, ledger, compactor,
summarizer, store adapters) composes it. The import contract in pyproject.toml enforces it.
"""
