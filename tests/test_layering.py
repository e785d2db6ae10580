"""The package boundaries of the design, checked on the sources: what may import what (lazy
imports inside functions included), that no two modules import each other through any chain,
and that database differences live in the dialect plugins."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from tests.helpers.layering import ROOT, imports, offending, sources


def test_core_imports_no_database_or_kafka_library() -> None:
    banned = ("sqlalchemy", "psycopg", "pymysql", "confluent_kafka", "pyspark", "pyharvest.bindings", "pyharvest.plugins")
    assert offending("core", lambda p, m: m.startswith(banned)) == []


def test_plugins_import_only_the_plugin_api_of_pyharvest() -> None:
    def bad(path: Path, module: str) -> bool:
        return module.startswith("pyharvest.") and not module.startswith(("pyharvest.plugins", "pyharvest.core"))

    assert offending("plugins", bad) == []
    # A built-in plugin module reaches pyharvest only through the API, as a third-party one does.
    builtins = [p for p in sources("plugins") if p.parent.name == "plugins" and p.stem not in ("__init__", "hookspecs")]
    assert builtins
    for p in builtins:
        own = {m for m in imports(p) if m.startswith("pyharvest")}
        assert own <= {"pyharvest.plugins.api"}, f"{p.name} imports {sorted(own)}"


def test_bindings_import_only_core_and_the_plugin_api() -> None:
    allowed = ("pyharvest.core", "pyharvest.plugins.api", "pyharvest.bindings")

    def bad(path: Path, module: str) -> bool:
        own = module == "pyharvest" or module.startswith("pyharvest.")
        return own and not any(module == a or module.startswith(a + ".") for a in allowed)

    assert offending("bindings", bad) == []


# A database's or driver's name, by any spelling: asked of a dialect, an engine, a URL or a
# Django connection, or written as a string (a type variant, a scheme, a lookup key).
NAMES = r"postgres|postgresql|psycopg2?|mysql|mariadb|pymysql|mysqldb|sqlite3?|pysqlite|mssql|microsoft|pyodbc|oracle|oracledb|cx_oracle"
NAME_TESTS = re.compile(
    r"\.(name|driver|drivername|vendor|get_backend_name\(\)|get_driver_name\(\)) *(==|!=|in |not in )"
    r"|is_postgresql|_is_psycopg"
    rf"|[\"']({NAMES})[\"']"
    rf"|\.startswith\(\(?[\"']({NAMES})"
)


@pytest.mark.parametrize("folder", ["core", "bindings", "pyharvest"])
def test_no_database_or_driver_name_tests_outside_plugins(folder: str) -> None:
    hits = [
        f"{p.relative_to(ROOT)}:{n}: {line.strip()}"
        for p in sources(folder)
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if NAME_TESTS.search(line.split("#")[0]) and "f.name" not in line
    ]
    assert hits == []


def test_the_name_check_sees_every_spelling() -> None:
    for line in ('if url.get_backend_name() == "sqlite":', 'sa.Integer().with_variant(x, "sqlite")',
                 "if engine.dialect.name in ('mysql', 'mariadb'):", 'if conn.driver == "psycopg":',
                 'if data_source.startswith("postgres"):', 'backend = {"microsoft": "mssql"}'):
        assert NAME_TESTS.search(line), line


PACKAGES = {"core": "pyharvest.core", "bindings": "pyharvest.bindings", "plugins": "pyharvest.plugins",
            "pyharvest": "pyharvest"}


def module_names() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for folder, prefix in PACKAGES.items():
        for p in sources(folder):
            parts = list(p.relative_to(ROOT / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join([prefix, *parts])] = p
    return found


def module_imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The modules ``name`` imports: at import, inside a function or under ``if TYPE_CHECKING``
    (a cycle of type-only imports is a knot all the same: neither module can be read, or
    moved, without the other). ``from package import module`` counts as the module."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import):
                found.update(a.name for a in child.names if a.name in modules)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    parent = package.rsplit(".", child.level - 1)[0] if child.level > 1 else package
                    base = f"{parent}.{base}" if base else parent
                for a in child.names:
                    target = f"{base}.{a.name}"
                    if target in modules:
                        found.add(target)
                    elif base in modules:
                        found.add(base)
            visit(child)

    visit(ast.parse(path.read_text(), str(path)))
    found.discard(name)
    return found


def import_cycles() -> list[list[str]]:
    """The strongly connected components of more than one module in the import graph (Tarjan)."""
    modules = module_names()
    graph = {name: module_imports(name, path, modules) for name, path in modules.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return cycles


def test_no_import_cycles_between_modules() -> None:
    assert import_cycles() == []


def test_no_test_module_imports_another() -> None:
    """What tests share lives in tests/helpers (or a conftest's fixtures), never in a test module."""
    tests = ROOT / "tests"
    found = [
        f"{p.relative_to(ROOT)}: {m}"
        for p in sorted(tests.rglob("*.py"))
        if "__pycache__" not in p.parts and "helpers" not in p.relative_to(tests).parts[:1]
        for m in sorted(imports(p))
        if m.startswith("tests.") and not m.startswith("tests.helpers")
    ]
    assert found == []
