"""Where the data goes (issue 13, finding 1): one pure resolution for the library, CLI and mount."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from contextledger.errors import InvalidArgument
from contextledger.store.dsn import DSN_ENV, resolve_target

PG = "postgresql://ledger:hunter2@db:5432/ledger"


def test_argument_wins_over_the_environment() -> None:
    target = resolve_target("memory://", {DSN_ENV: PG})
    assert (target.kind, target.dsn, target.source) == ("memory", "memory://", "argument")


def test_environment_then_embedded() -> None:
    env = resolve_target(None, {DSN_ENV: PG})
    assert (env.kind, env.dsn, env.source) == ("postgres", PG, "environment")
    assert "hunter2" not in env.describe() and "db:5432" in env.describe()
    embedded = resolve_target(None, {DSN_ENV: "  "}, home="/data/cl")
    assert (embedded.kind, embedded.dsn, embedded.source) == ("embedded", None, "default")
    assert "/data/cl" in embedded.describe()


@pytest.mark.parametrize(
    ("dsn", "env", "where"),
    [("mysql://x", {}, "dsn"), (None, {DSN_ENV: "sqlite:///x"}, "$CONTEXTLEDGER_DSN")],
)
def test_a_bad_target_names_where_it_came_from(
    dsn: str | None, env: dict[str, str], where: str
) -> None:
    with pytest.raises(InvalidArgument) as info:
        resolve_target(dsn, env)
    assert str(info.value).startswith(f"[INVALID_ARGUMENT] {where} must be")


@given(
    st.one_of(st.none(), st.sampled_from(["memory://", PG])), st.sampled_from(["", PG, "memory://"])
)
def test_resolution_order(dsn: str | None, env: str) -> None:
    target = resolve_target(dsn, {DSN_ENV: env} if env else {})
    expected = dsn if dsn is not None else (env or None)
    assert target.dsn == expected
    assert target.source == ("argument" if dsn else "environment" if env else "default")
