"""The ``Store`` port: what every store must implement, so callers need not probe."""

from __future__ import annotations

import inspect

from contextledger.store.base import Store
from contextledger.store.memory import MemoryStore


def test_purge_and_its_records_are_part_of_the_port() -> None:
    """``purge``/``purges`` are abstract on the port (the CLI and REST call them without a
    ``getattr`` probe), and the memory store implements both."""
    assert {"purge", "purges"} <= Store.__abstractmethods__
    assert not MemoryStore.__abstractmethods__
    for name in ("purge", "purges"):
        assert inspect.iscoroutinefunction(getattr(MemoryStore, name))
        assert getattr(MemoryStore, name) is not getattr(Store, name)
