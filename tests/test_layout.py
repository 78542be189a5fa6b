"""The package's shape: imports run downward only, and no module imports itself in a circle.

The layers, each importing only the ones after it (DESIGN.md, "Package layout"):

    __main__ -> cli -> the package (its API) -> replay -> mining -> lineage, skills
             -> mechanisms, search -> llm, formats -> cuda -> executors -> conditions, gate
             -> problem
             -> headers (the local headers a kernel includes)
             -> kernel, limits

A module may import its own component and the components of the layers below it, never one
beside it. The CUDA analysis sits below formats because `klineage new` reads a kernel's
indexing to say its tensors' shapes (`formats/shape_guess.py`). Imports under
``if TYPE_CHECKING:`` are for the type checker only and are not followed: they run nothing.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import networkx as nx
import pytest

from tests.conftest import REPO

PACKAGE = REPO / "klineage"

LAYERS: tuple[tuple[str, ...], ...] = (
    ("kernel", "limits"),
    ("headers",),
    ("problem",),
    ("conditions", "gate"),
    ("executors",),
    ("cuda",),
    ("llm", "formats"),
    ("mechanisms", "search"),
    ("lineage", "skills"),
    ("mining",),
    ("replay",),
    ("",),  # the package itself: klineage/__init__.py, the public API
    ("cli",),
    ("__main__",),
)
"""Components by layer, bottom first; a component is a top-level module or subpackage."""

RANK = {component: rank for rank, layer in enumerate(LAYERS) for component in layer}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _component(module: str) -> str:
    """`klineage.mining.walk` -> `mining`; the package itself -> ``""``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _is_type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def _runtime_imports(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement, at any depth (a lazy import inside a function counts), except
    those in an ``if TYPE_CHECKING:`` block."""
    for node in ast.iter_child_nodes(tree):
        if _is_type_checking(node):
            continue
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        yield from _runtime_imports(node)


def _import_graph() -> nx.DiGraph:
    modules = {_module_name(path): path for path in PACKAGE.rglob("*.py")}
    graph = nx.DiGraph()
    graph.add_nodes_from(modules)
    for module, path in modules.items():
        for node in _runtime_imports(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif node.level or not node.module:
                raise AssertionError(f"{module}: relative import; write klineage.… in full")
            else:  # `from klineage.x import y`: y is a module or a name in klineage.x
                found = [f"{node.module}.{alias.name}" for alias in node.names]
                targets = [t if t in modules else node.module for t in found]
            for target in targets:
                # a module reaching its own package's namespace (the mechanism registry walks
                # its package to find its plugins) is the same unit, not a dependency
                # nor is a module run as `python -m` importing itself under its package name
                # (a class it unpickles must be the package module's, not __main__'s)
                if (
                    target.startswith("klineage")
                    and not module.startswith(target + ".")
                    and target != module
                ):
                    graph.add_edge(module, target)
    return graph


@pytest.fixture(scope="module")
def graph() -> nx.DiGraph:
    """The package's import graph, parsed once per worker that runs these tests (not at
    collection, which every worker does)."""
    return _import_graph()


def test_every_component_has_a_layer(graph: nx.DiGraph) -> None:
    components = {_component(module) for module in graph}
    assert components <= set(RANK), f"place these in LAYERS: {sorted(components - set(RANK))}"


def test_no_module_imports_itself_in_a_circle(graph: nx.DiGraph) -> None:
    cycles = sorted(sorted(cycle) for cycle in nx.simple_cycles(graph))
    assert not cycles, f"import cycles: {cycles}"


@pytest.mark.parametrize("layer", [c for layer in LAYERS for c in layer])
def test_imports_run_downward_only(graph: nx.DiGraph, layer: str) -> None:
    upward = sorted(
        f"{module} -> {target}"
        for module, target in graph.edges
        if _component(module) == layer
        and _component(target) != layer
        and RANK[_component(target)] >= RANK[layer]
    )
    assert not upward, f"imports from a layer above or beside {layer or 'klineage'}: {upward}"


def test_the_gate_needs_nothing_above_problems(graph: nx.DiGraph) -> None:
    # the gate judges any kernel for any problem: it never sees mechanisms, lineages or skills
    reached = {_component(m) for m in nx.descendants(graph, "klineage.gate")}
    assert reached <= {"gate", "kernel", "problem"}, sorted(reached)


def test_the_graph_sees_lazy_imports(graph: nx.DiGraph) -> None:
    # the package imports the parser inside a function, to keep `import klineage` fast
    assert graph.has_edge("klineage", "klineage.cuda.source")
