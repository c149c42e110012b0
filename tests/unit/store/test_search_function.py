"""The search function of migration 0018 runs the store's own search statements: frozen
in the migration, they must still be what ``search_sql`` renders, with their arguments in
the same order, or the Citus path would answer differently from one server."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

from contextledger.store.base import SearchQuery
from contextledger.store.lexical import read_from
from contextledger.store.postgres.placeholders import named
from contextledger.store.postgres.search import SEARCH_CALL, search_call, search_sql

MIGRATION = Path(__file__).parents[3] / "migrations" / "versions" / "0018_delegated_search.py"


def _migration() -> ModuleType:
    spec = importlib.util.spec_from_file_location("contextledger_migration_0018", MIGRATION)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("given_branch", [False, True], ids=["live", "replay"])
def test_the_function_s_statements_are_the_store_s(given_branch: bool) -> None:
    """A change to the search needs a new migration that replaces the function."""
    migration = _migration()
    frozen = migration.REPLAY if given_branch else migration.LIVE
    order = migration.REPLAY_ARGS if given_branch else migration.LIVE_ARGS
    store = named(search_sql(indexed=True, given_branch=given_branch, store=True))
    assert frozen == store.text
    assert order == ("p_session", *(f"p_{name}" for name in store.names))
    assert f"$live${migration.LIVE}$live$" in migration.FUNCTION
    assert f"$replay${migration.REPLAY}$replay$" in migration.FUNCTION


def test_the_call_passes_the_function_s_arguments_in_its_order() -> None:
    """``search_call`` lines its values up with the function's signature."""
    migration = _migration()
    params = migration.FUNCTION.split("search_messages(", 1)[1].split(")", 1)[0]
    names = [p.split()[0] for p in params.split(",")]
    assert len(names) == SEARCH_CALL.count("$") == 10
    q = SearchQuery("s", "which port?", {9, 10}, 10, {1, 2, 3}, 5, "english", hop=True)
    call = search_call(q, [4])
    assert dict(zip(names, call, strict=True)) == {
        "p_session": "s",
        "p_query": "which port?",
        "p_config": "english",
        "p_upto": 10,
        "p_tail": read_from(10, {9, 10}),  # below what the request carries at its end
        "p_exclude": "{[9,10]}",
        "p_gaps": [4],
        "p_limit": 5,
        "p_hop": True,
        "p_branch": "{[1,3]}",
    }
    live = SearchQuery("s", "q", {10}, 10, None, 5, "english")
    assert search_call(live, None)[-1] is None  # live: no branch
