"""Persistence adapters behind the ``Store`` port (``base.py``): memory and PostgreSQL."""
