"""Dialect plugins: hook specs, loading by entry-point name, and a real third-party plugin."""

from __future__ import annotations

import importlib
import importlib.metadata
import subprocess
import sys
import types
from pathlib import Path

import pytest
import sqlalchemy as sa

from pyharvest.bindings.sql import create_binding, create_outbox_table
from pyharvest.bindings.sql.connect import resolve
from pyharvest.core.errors import BindingError
from pyharvest.plugins import hookimpl, hookspec
from pyharvest.plugins.api import (
    Dialect,
    DialectOptions,
    TransactionalMark,
    dialect_for_backend,
    installed_dialects,
    load_dialect,
)
from pyharvest.testing.compiled import CompiledConformance
from pyharvest.testing.conformance import DialectConformance

BUILTINS = ("postgresql", "sqlite", "mysql", "mssql", "oracle")


def test_markers_belong_to_the_pyharvest_project() -> None:
    assert hookspec.project_name == hookimpl.project_name == "pyharvest"


@pytest.mark.parametrize("name", BUILTINS)
def test_builtin_dialects_load_by_name(name: str) -> None:
    d = load_dialect(name)
    assert d.name == name and isinstance(d, Dialect)
    assert name in installed_dialects()


def test_unknown_dialect_lists_the_installed_ones() -> None:
    with pytest.raises(BindingError) as e:
        load_dialect("nosuchdb")
    msg = str(e.value)
    assert "'nosuchdb'" in msg and all(n in msg for n in BUILTINS) and "pyharvest.dialects" in msg


@pytest.mark.parametrize(
    ("url", "name"),
    [
        ("postgresql+psycopg://u@h/d", "postgresql"),
        ("sqlite:///x.db", "sqlite"),
        ("mysql+pymysql://u@h/d", "mysql"),
        ("mariadb+pymysql://u@h/d", "mysql"),
        ("mssql+pymssql://u@h/d", "mssql"),
        ("oracle+oracledb://u@h/d", "oracle"),
        ("host=h dbname=d", "postgresql"),
    ],
)
def test_default_dialect_from_the_url(url: str, name: str) -> None:
    assert resolve(url)[1].name == name


def test_unknown_backend_says_how_to_name_a_dialect() -> None:
    with pytest.raises(BindingError, match="Name one explicitly"):
        dialect_for_backend("firebird")


def test_a_plugin_with_a_misspelt_hook_is_refused() -> None:
    plugin = types.ModuleType("bad_plugin")

    @hookimpl
    def pyharvest_dialect() -> DialectOptions:
        return DialectOptions(name="bad")

    @hookimpl
    def pyharvest_mark_stratgy(table: object) -> None:  # typo
        return None

    plugin.pyharvest_dialect = pyharvest_dialect  # type: ignore[attr-defined]
    plugin.pyharvest_mark_stratgy = pyharvest_mark_stratgy  # type: ignore[attr-defined]
    with pytest.raises(Exception, match="pyharvest_mark_stratgy"):
        Dialect("bad", plugin)


def test_a_plugin_must_declare_its_registered_name() -> None:
    plugin = types.ModuleType("named")

    @hookimpl
    def pyharvest_dialect() -> DialectOptions:
        return DialectOptions(name="other")

    plugin.pyharvest_dialect = pyharvest_dialect  # type: ignore[attr-defined]
    with pytest.raises(BindingError, match="must match"):
        Dialect("named", plugin)


def test_a_plugin_must_declare_its_options() -> None:
    plugin = types.ModuleType("silent")

    @hookimpl
    def pyharvest_dialect() -> str:
        return "silent"

    plugin.pyharvest_dialect = pyharvest_dialect  # type: ignore[attr-defined]
    with pytest.raises(BindingError, match="expected pyharvest.plugins.api.DialectOptions"):
        Dialect("silent", plugin)
    with pytest.raises(TypeError, match="shard_colum"):
        DialectOptions(name="typo", shard_colum=True)  # type: ignore[call-arg]  # a misspelt option fails too


# --- a real third-party plugin, installed with pip -----------------------------------

PLUGIN_DIR = Path(__file__).parent / "thirdparty_dialect"


def _install_litesql() -> None:
    """Install the example plugin into this venv (not editable: an editable install's path
    hook would only be read at interpreter start). Skipped when already current."""
    source = (PLUGIN_DIR / "pyharvest_litesql" / "__init__.py").read_text()
    try:
        import pyharvest_litesql  # noqa: F401

        if Path(pyharvest_litesql.__file__).read_text() == source:  # type: ignore[arg-type]
            return
    except ImportError:
        pass
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
         "--force-reinstall", str(PLUGIN_DIR)],
        check=True,
        capture_output=True,
        cwd=PLUGIN_DIR,
    )
    importlib.invalidate_caches()
    sys.modules.pop("pyharvest_litesql", None)


@pytest.fixture(scope="session")
def litesql_installed() -> str:
    _install_litesql()
    assert "litesql" in installed_dialects(), "the litesql entry point is not visible after pip install"
    return "litesql"


def test_third_party_dialect_is_selected_by_name(litesql_installed: str, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'x.db'}"
    create_outbox_table(url, "outbox", dialect=litesql_installed)
    binding = create_binding(url, "outbox", dialect=litesql_installed)
    try:
        assert binding.dialect.name == "litesql"
        assert isinstance(binding.marker, TransactionalMark)
    finally:
        binding.dispose()
    assert resolve(url)[1].name == "sqlite"  # never picked from the URL


class TestThirdPartyCompiled(CompiledConformance):
    """The compiled checks hold for a third-party dialect that names no SQLAlchemy backend."""

    @pytest.fixture
    def conformance_dialect(self, litesql_installed: str) -> str:
        return litesql_installed

    @pytest.fixture
    def conformance_sqlalchemy_dialect(self) -> sa.Dialect:
        from sqlalchemy.dialects import sqlite

        return sqlite.dialect()


class TestThirdPartyConformance(DialectConformance):
    @pytest.fixture
    def conformance_data_source(self, tmp_path: Path) -> str:
        return f"sqlite:///{tmp_path / 'litesql.db'}"

    @pytest.fixture
    def conformance_dialect(self, litesql_installed: str) -> str:
        return litesql_installed
