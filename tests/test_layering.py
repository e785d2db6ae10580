"""The package boundaries of the design, checked on the sources: what may import what (lazy
imports inside functions included), that no two modules import each other through any chain,
that core's subpackages form a DAG, and that database differences live in the dialect plugins."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.helpers.layering import (
    ROOT,
    core_package_edges,
    import_cycles,
    imports,
    module_imports,
    offending,
    package_cycles,
    sources,
)


def test_core_imports_no_database_or_kafka_library() -> None:
    banned = ("sqlalchemy", "psycopg", "pymysql", "confluent_kafka", "pyspark", "pyharvest.bindings", "pyharvest.plugins")
    assert offending("core", lambda p, m: m.startswith(banned)) == []


def test_plugins_import_only_the_plugin_api_of_pyharvest() -> None:
    def bad(path: Path, module: str) -> bool:
        return module.startswith("pyharvest.") and not module.startswith(("pyharvest.plugins", "pyharvest.core"))

    assert offending("plugins", bad) == []
    # A built-in plugin module reaches pyharvest only through the API, as a third-party one does;
    # it may hold part of itself in a module of its own (``postgresql_activity.py`` for
    # ``postgresql.py``), which is checked alike.
    builtins = [p for p in sources("plugins") if p.parent.name == "plugins" and p.stem not in ("__init__", "hookspecs")]
    assert builtins
    for p in builtins:
        own = {m for m in imports(p) if m.startswith("pyharvest")}
        its_parts = {m for m in own if m.startswith(f"pyharvest.plugins.{p.stem}_")}
        assert own - its_parts <= {"pyharvest.plugins.api"}, f"{p.name} imports {sorted(own)}"


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


def test_no_import_cycles_between_modules() -> None:
    assert import_cycles() == []


def test_core_subpackages_form_a_dag() -> None:
    """No two of core's subpackages import each other through any chain, type-only imports
    and string annotations included: a subpackage can be read, and moved, with only those
    below it."""
    assert package_cycles(core_package_edges()) == []


def test_the_package_check_sees_type_only_imports_and_string_annotations(tmp_path: Path) -> None:
    core = "pyharvest.core"  # made-up modules are spelt with it, so that the docs check of references skips them
    source = tmp_path / "m.py"
    source.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from pyharvest.core.election.neli import Neli\n"
        "def f(x: 'pyharvest.core.telemetry.events.Event') -> 'list[pyharvest.core.ports.kafka.Producer]':\n"
        "    from ..config import settings\n"
    )
    modules = dict.fromkeys(["pyharvest.core.election.neli", "pyharvest.core.telemetry.events",
                             "pyharvest.core.ports.kafka", "pyharvest.core.config.settings"], source)
    found = module_imports(f"{core}.outbox.m", source, modules)
    assert found == set(modules)
    edges = {(f"{core}.a", f"{core}.b"): [f"{core}.a.x -> {core}.b.y"],
             (f"{core}.b", f"{core}.a"): [f"{core}.b.z -> {core}.a"]}
    assert package_cycles(edges) == [f"a <-> b: {core}.a.x -> {core}.b.y; {core}.b.z -> {core}.a"]


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
