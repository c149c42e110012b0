"""The service: FastAPI over the same ``Ledger``/``Session`` API (REST, an
OpenAI-compatible proxy, tenants, metrics, the audit page).

Install with the ``service`` extra; ``contextledger serve`` starts it. This
package's ``__init__`` imports nothing heavy, so ``contextledger keys`` works
without FastAPI.
"""
