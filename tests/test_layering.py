"""The package boundaries of the design, checked on the sources: what may import what, and
that database differences live in the dialect plugins."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


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


def test_bindings_reach_plugins_only_through_the_api() -> None:
    def bad(path: Path, module: str) -> bool:
        return module.startswith("pyharvest.plugins") and module != "pyharvest.plugins.api"

    assert offending("bindings", bad) == []


@pytest.mark.parametrize("folder", ["core", "bindings", "pyharvest"])
def test_no_database_or_driver_name_branches_outside_plugins(folder: str) -> None:
    pattern = re.compile(r"(dialect|db|self)\.(name|driver) *(==|!=|in |not in )|is_postgresql|_is_psycopg")
    hits = [
        f"{p.relative_to(ROOT)}:{n}: {line.strip()}"
        for p in sources(folder)
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if pattern.search(line) and "f.name" not in line
    ]
    assert hits == []
