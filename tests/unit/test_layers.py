"""The package's import graph: no cycles anywhere, lazy imports included.

import-linter (``lint-imports`` in ``.ci/run``) enforces which layer may import which;
this test enforces the other half of the dependency rule: no module reaches itself
through any chain of imports, including imports inside function bodies.
"""

from __future__ import annotations

import grimp


def _cycles(graph: grimp.ImportGraph, modules: set[str]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for root in sorted(modules):
        if root in index:
            continue
        work: list[tuple[str, list[str]]] = [(root, [])]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        work[-1] = (root, sorted(graph.find_modules_directly_imported_by(root) & modules))
        while work:
            node, todo = work[-1]
            if todo:
                nxt = todo.pop()
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append(
                        (nxt, sorted(graph.find_modules_directly_imported_by(nxt) & modules))
                    )
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_import_cycles_in_the_package() -> None:
    graph = grimp.build_graph("contextledger", cache_dir=None)
    modules = set(graph.modules)
    assert _cycles(graph, modules) == []


def test_the_cycle_finder_finds_a_cycle() -> None:
    """The finder itself can fail: a graph with a two-module cycle is reported."""
    graph = grimp.ImportGraph()
    for name in ("pkg", "pkg.a", "pkg.b", "pkg.c"):
        graph.add_module(name)
    graph.add_import(importer="pkg.a", imported="pkg.b")
    graph.add_import(importer="pkg.b", imported="pkg.a")
    graph.add_import(importer="pkg.c", imported="pkg.a")
    assert _cycles(graph, set(graph.modules)) == [["pkg.a", "pkg.b"]]


def _top_level() -> set[str]:
    graph = grimp.build_graph("contextledger", cache_dir=None)
    return {m for m in graph.modules if m.count(".") == 1}


def _contract(name: str) -> list[str]:
    import tomllib
    from pathlib import Path

    pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
    contracts = tomllib.loads(pyproject.read_text())["tool"]["importlinter"]["contracts"]
    [contract] = [c for c in contracts if c["name"].startswith(name)]
    return list(contract["forbidden_modules"])


def test_the_layer_contracts_name_every_module() -> None:
    """A new top-level module is forbidden to core and store unless listed as allowed here:
    import-linter only checks the modules a contract names."""
    modules = _top_level()
    core_may = {"contextledger.core", "contextledger.errors"}
    store_may = core_may | {"contextledger.store", "contextledger.extras"}
    assert modules - core_may <= set(_contract("core is pure"))
    assert modules - store_may <= set(_contract("store adapters"))


def test_core_and_store_import_only_what_they_may_lazy_imports_included() -> None:
    graph = grimp.build_graph("contextledger", cache_dir=None)
    allowed = {
        "contextledger.core": ("contextledger.core", "contextledger.errors"),
        "contextledger.store": (
            "contextledger.core",
            "contextledger.store",
            "contextledger.errors",
            "contextledger.extras",
        ),
    }
    for layer, may in allowed.items():
        for module in graph.find_descendants(layer) | {layer}:
            for imported in graph.find_modules_directly_imported_by(module):
                if imported.startswith("contextledger"):
                    assert imported.startswith(may), f"{module} imports {imported}"
