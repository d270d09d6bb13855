"""The package's import graph: no cycles, ``TYPE_CHECKING`` imports included.

The layers and the adapters' independence are import-linter contracts (pyproject.toml,
``lint-imports``); layers cannot see a cycle between two modules of one layer, this test can.
"""

from __future__ import annotations

import grimp


def cycles(graph: grimp.ImportGraph) -> set[tuple[str, ...]]:
    """Every import ``a -> b`` from which ``b`` leads back to ``a``: ``(a, b, ..., a)``."""
    found = set()
    for importer in graph.modules:
        for imported in graph.find_modules_directly_imported_by(importer):
            back = graph.find_shortest_chain(importer=imported, imported=importer)
            if back is not None:
                found.add((importer, *back))
    return found


def test_the_package_has_no_import_cycle() -> None:
    graph = grimp.build_graph("hydrator", exclude_type_checking_imports=False)
    assert cycles(graph) == set()


def test_a_cycle_hidden_behind_type_checking_is_found() -> None:
    """The check itself: the cycle ``observe <-> service`` this layout removed, put back."""
    graph = grimp.build_graph("hydrator", exclude_type_checking_imports=False)
    graph.add_import(importer="hydrator.runtime.observe", imported="hydrator.runtime.service")
    observe, service = "hydrator.runtime.observe", "hydrator.runtime.service"
    assert (observe, service, observe) in cycles(graph)
