"""contextledger: an LLM agent's memory as an append-only event ledger in PostgreSQL."""
