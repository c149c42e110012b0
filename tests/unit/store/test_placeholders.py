"""SQL placeholders by name (``store/postgres/placeholders.py``): ``$name`` -> ``$n``."""

from __future__ import annotations

import re
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from contextledger.store.base import SearchQuery
from contextledger.store.postgres import search_sql, search_statement
from contextledger.store.postgres.placeholders import bind, named

NAMES = st.sampled_from(["query", "upto", "exclude", "branch", "limit", "tail", "a_1", "Z"])
#: SQL-ish text between markers: casts, operators, quotes, but never a ``$``.
FILLER = st.sampled_from(
    [" ", " AND x = ", "::bigint", " @> ", "'{}'::jsonb", " ->> 'k' ", "(", ")", ",", "\n"]
)


@st.composite
def templates(draw: st.DrawFn) -> tuple[str, int, list[str]]:
    """A statement with ``$1..$k`` positional markers and named ones (duplicates likely)."""
    positional = draw(st.integers(min_value=0, max_value=3))
    parts: list[str] = []
    used: list[str] = []
    for _ in range(draw(st.integers(min_value=0, max_value=12))):
        parts.append(draw(FILLER))
        if positional and draw(st.booleans()):
            parts.append(f"${draw(st.integers(min_value=1, max_value=positional))}")
        else:
            name = draw(NAMES)
            used.append(name)
            parts.append(f"${name}")
    for n in range(1, positional + 1):  # every positional one appears at least once
        parts.append(f" ${n}")
    return "".join(parts), positional, used


def substituted(text: str, value_of: Any) -> str:
    """``text`` with each marker replaced by ``<value>``: what the server would bind."""
    return re.sub(r"\$([A-Za-z_][A-Za-z0-9_]*|[0-9]+)", lambda m: f"<{value_of(m[1])}>", text)


@given(templates())
def test_names_bind_the_same_values_as_written_numbered_by_first_appearance(
    template: tuple[str, int, list[str]],
) -> None:
    sql, positional, used = template
    values = {name: f"v-{name}" for name in used}
    fixed = [f"p{n}" for n in range(1, positional + 1)]
    text, args = bind(sql, values, *fixed)
    # the server's view (``$n`` -> args[n-1]) equals the author's (``$name`` -> values)
    expected = substituted(sql, lambda m: fixed[int(m) - 1] if m.isdigit() else values[m])
    assert substituted(text, lambda m: args[int(m) - 1]) == expected
    # dense numbers: one per distinct name, after the positional ones, in first appearance
    distinct = list(dict.fromkeys(used))
    assert named(sql).names == tuple(distinct)
    assert len(args) == positional + len(distinct)
    assert not re.search(r"\$[A-Za-z_]", text)


def test_a_duplicate_name_is_one_parameter() -> None:
    text, args = bind("SELECT $x + $1 WHERE y = $x AND z = $w", {"x": 7, "w": 8}, "s")
    assert text == "SELECT $2 + $1 WHERE y = $2 AND z = $3"
    assert args == ["s", 7, 8]


def test_casts_and_json_operators_are_not_markers() -> None:
    text, args = bind("SELECT $a::text::int8multirange, d ->> 'k', '{}'::jsonb", {"a": 1})
    assert text == "SELECT $1::text::int8multirange, d ->> 'k', '{}'::jsonb"
    assert args == [1]


@pytest.mark.parametrize(
    ("values", "positional", "message"),
    [
        ({"a": 1}, (), "missing \\['b'\\]"),
        ({"a": 1, "b": 2, "c": 3}, (), "not in the statement \\['c'\\]"),
        ({"a": 1, "b": 2}, ("extra",), "takes 0 positional arguments, 1 given"),
    ],
)
def test_a_name_missing_or_left_over_is_refused(
    values: dict[str, int], positional: tuple[str, ...], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        bind("SELECT $a, $b", values, *positional)


def test_dollar_quoting_is_refused_not_misread() -> None:
    with pytest.raises(ValueError, match="dollar quoting"):
        named("DO $body$ BEGIN END $body$")


@pytest.mark.parametrize("indexed", [True, False])
@pytest.mark.parametrize("given_branch", [True, False])
@pytest.mark.parametrize("store", [True, False])
def test_every_search_shape_binds_every_parameter_once(
    indexed: bool, given_branch: bool, store: bool
) -> None:
    """The search statement in each of its shapes: ``$1`` the session, then dense numbers,
    each one bound (a name left unbound or unused would raise)."""
    q = SearchQuery(
        "s",
        "which gateway?",
        {3, 4},
        9,
        {1, 2, 5} if given_branch else None,
        10,
        "english" if indexed else "simple",
    )
    text, args = search_statement(q, [6, 7], store=store)
    numbers = {int(n) for n in re.findall(r"\$([0-9]+)", text)}
    assert numbers == set(range(1, len(args) + 1))
    assert args[0] == "s"  # the session id
    assert ("{[1,2],[5,5]}" in args) is given_branch
    assert not re.search(r"\$[A-Za-z_]", text)
    assert search_sql(indexed=indexed, given_branch=given_branch, store=store) is search_sql(
        indexed=indexed, given_branch=given_branch, store=store
    )
