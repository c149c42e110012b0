"""libpq's ``connect_timeout`` in a DSN: asyncpg's timeout, never a server setting."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from contextledger.errors import ConfigError
from contextledger.store.dsn import asyncpg_dsn, connect_timeout, sqlalchemy_url


@pytest.mark.parametrize(
    ("dsn", "expected", "seconds"),
    [
        ("postgresql://u@h/db?connect_timeout=3", "postgresql://u@h/db", 3.0),
        (
            "postgresql://u@h/db?connect_timeout=3&sslmode=require",
            "postgresql://u@h/db?sslmode=require",
            3.0,
        ),
        (
            "postgres://u@h/db?sslmode=require&connect_timeout=2.5",
            "postgresql://u@h/db?sslmode=require",
            2.5,
        ),
        ("postgresql://u@h/db?a=1&CONNECT_TIMEOUT=4&b=2", "postgresql://u@h/db?a=1&b=2", 4.0),
        ("postgresql://u@h/db?connect_timeout=0", "postgresql://u@h/db", None),
        ("postgresql://u@h/db", "postgresql://u@h/db", None),
    ],
)
def test_connect_timeout_moves_out_of_the_dsn(
    dsn: str, expected: str, seconds: float | None
) -> None:
    assert asyncpg_dsn(dsn) == expected
    assert connect_timeout(dsn) == seconds
    assert sqlalchemy_url(dsn) == expected.replace("postgresql://", "postgresql+asyncpg://")


@pytest.mark.parametrize("bad", ["x", "-1", "nan", "inf", ""])
def test_a_timeout_that_is_not_seconds_is_a_config_error(bad: str) -> None:
    with pytest.raises(ConfigError):
        connect_timeout(f"postgresql://u@h/db?connect_timeout={bad}")


@given(
    st.lists(
        st.tuples(st.sampled_from(["sslmode", "host", "port", "x"]), st.text("abc123", min_size=1)),
        max_size=4,
    ),
    st.integers(0, 4),
    st.integers(1, 99),
)
def test_other_parameters_stay_in_order(params: list[tuple[str, str]], at: int, secs: int) -> None:
    query = [f"{k}={v}" for k, v in params]
    query.insert(min(at, len(query)), f"connect_timeout={secs}")
    out = asyncpg_dsn("postgresql://u@h/db?" + "&".join(query))
    kept = "&".join(f"{k}={v}" for k, v in params)
    assert out == "postgresql://u@h/db" + (f"?{kept}" if kept else "")
