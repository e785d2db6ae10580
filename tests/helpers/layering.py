"""The source tree's imports, read from the files (imports inside functions and under
``if TYPE_CHECKING`` included): what the layering tests check, and the module list the map's
test checks ``docs/architecture.md`` against."""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

#: Each source folder and the package it installs as (setup.py's package-dir mapping).
PACKAGES = {"core": "pyharvest.core", "bindings": "pyharvest.bindings", "plugins": "pyharvest.plugins",
            "pyharvest": "pyharvest"}


def sources(folder: str) -> list[Path]:
    return sorted(p for p in (ROOT / folder).rglob("*.py") if "__pycache__" not in p.parts)


def imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def offending(folder: str, rule) -> list[str]:
    return [f"{p.relative_to(ROOT)}: {m}" for p in sources(folder) for m in sorted(imports(p)) if rule(p, m)]


def module_names() -> dict[str, Path]:
    """Every module of the four folders, by the name it is imported as."""
    found: dict[str, Path] = {}
    for folder, prefix in PACKAGES.items():
        for p in sources(folder):
            parts = list(p.relative_to(ROOT / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join([prefix, *parts])] = p
    return found


def _annotations(tree: ast.AST) -> Iterable[ast.expr]:
    for node in ast.walk(tree):
        if isinstance(node, ast.arg | ast.AnnAssign) and node.annotation is not None:
            yield node.annotation
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.returns is not None:
            yield node.returns


def _dotted(node: ast.AST) -> Iterable[str]:
    """The dotted names an expression spells (``a.b.c`` as ``a.b.c``)."""
    for n in ast.walk(node):
        parts: list[str] = []
        while isinstance(n, ast.Attribute):
            parts.append(n.attr)
            n = n.value
        if isinstance(n, ast.Name) and parts:
            yield ".".join([n.id, *reversed(parts)])


def string_annotation_modules(tree: ast.AST, modules: dict[str, Path]) -> set[str]:
    """The modules a string annotation names by its dotted path (``x: "pyharvest.core.<package>.<module>.Name"``):
    a reference to a module's contents all the same, though no import statement says so."""
    found: set[str] = set()
    for annotation in _annotations(tree):
        for c in ast.walk(annotation):
            if not (isinstance(c, ast.Constant) and isinstance(c.value, str)):
                continue
            try:
                parsed = ast.parse(c.value, mode="eval")
            except SyntaxError:
                continue
            for name in _dotted(parsed):
                while name and name not in modules:
                    name = name.rpartition(".")[0]
                if name:
                    found.add(name)
    return found


def module_imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The modules ``name`` imports: at import, inside a function or under ``if TYPE_CHECKING``
    (a cycle of type-only imports is a knot all the same: neither module can be read, or
    moved, without the other), and those a string annotation names by its dotted path.
    ``from package import module`` counts as the module."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name in modules)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{parent}.{base}" if base else parent
            for a in node.names:
                target = f"{base}.{a.name}"
                if target in modules:
                    found.add(target)
                elif base in modules:
                    found.add(base)
    found |= string_annotation_modules(tree, modules)
    found.discard(name)
    return found


def import_graph() -> dict[str, set[str]]:
    """Each module of the four folders and the modules of theirs it imports."""
    modules = module_names()
    return {name: module_imports(name, path, modules) for name, path in modules.items()}


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return components


def import_cycles() -> list[list[str]]:
    """The knots of the module graph: modules that import each other through some chain."""
    return strongly_connected(import_graph())


def core_package(module: str) -> str | None:
    """The subpackage of ``core/`` a module belongs to (``pyharvest.core.election`` for
    ``pyharvest.core.election.neli``), a top-level core module itself (``pyharvest.core.errors``),
    None outside ``core/`` and for ``pyharvest.core`` itself."""
    parts = module.split(".")
    if parts[:2] != ["pyharvest", "core"] or len(parts) < 3:
        return None
    return ".".join(parts[:3])


def core_package_edges() -> dict[tuple[str, str], list[str]]:
    """Which of core's subpackages imports which, each edge with the module imports that make
    it (``"pyharvest.core.healing.stuck_clients -> pyharvest.core.telemetry.logs"``)."""
    edges: dict[tuple[str, str], list[str]] = {}
    for module, targets in import_graph().items():
        source = core_package(module)
        for target in sorted(targets):
            into = core_package(target)
            if source and into and source != into:
                edges.setdefault((source, into), []).append(f"{module} -> {target}")
    return edges


def package_cycles(edges: dict[tuple[str, str], list[str]]) -> list[str]:
    """Each knot of the package graph, named with the module imports that tie it."""
    graph: dict[str, set[str]] = {}
    for a, b in edges:
        graph.setdefault(a, set()).add(b)
    knots = []
    for component in strongly_connected(graph):
        inside = set(component)
        ties = [tie for (a, b), found in sorted(edges.items()) if a in inside and b in inside for tie in found]
        knots.append(" <-> ".join(p.rpartition(".")[2] for p in component) + ": " + "; ".join(ties))
    return knots
