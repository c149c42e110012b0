"""The Citus start-up check's rules (store/distributed.py), without a cluster: the
probe's findings in, the reasons to refuse out. The probe itself runs on a real cluster
in tests/integration/test_citus.py (ops/citus)."""

from __future__ import annotations

import pytest

from contextledger.store.distributed import REQUIRED_SETTINGS, Citus, problems

READY = Citus("13.2-1", dict(REQUIRED_SETTINGS), True)


def test_a_ready_cluster_has_no_problem() -> None:
    assert problems(READY) == []


@pytest.mark.parametrize("value", [None, "none", "", "LOCAL "])
def test_set_propagation_must_be_local(value: str | None) -> None:
    found = Citus("13.2-1", {"citus.propagate_set_commands": value}, True)
    (why,) = problems(found)
    assert "citus.propagate_set_commands" in why and repr(value) in why


def test_undistributed_tables_are_refused_once_migrated_only() -> None:
    found = Citus("13.2-1", dict(REQUIRED_SETTINGS), False)
    (why,) = problems(found)
    assert "not distributed" in why and "0014" in why
    assert problems(found, schema=False) == []  # before the migrations: not yet
    assert problems(Citus("13.2-1", dict(REQUIRED_SETTINGS), None)) == []  # no schema yet
