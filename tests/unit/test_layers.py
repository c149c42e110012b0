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
