"""The compiled-level conformance kit against every built-in dialect: no server needed, so
SQL Server's and Oracle's marks are held to the same rules as the databases that run here."""

from __future__ import annotations

import pytest

from pyharvest.plugins.api import installed_dialects, load_dialect
from pyharvest.testing.compiled import CompiledConformance, compile_mark

BUILTIN = ["postgresql", "mysql", "sqlite", "mssql", "oracle"]


def test_every_builtin_is_installed() -> None:
    assert set(BUILTIN) <= set(installed_dialects())


class TestBuiltinDialectsCompiled(CompiledConformance):
    @pytest.fixture(params=BUILTIN)
    def conformance_dialect(self, request: pytest.FixtureRequest) -> str:
        return str(request.param)


class _PlainMark:
    """A hand-written mark that forgets the table's row filters: what SQL Server's and Oracle's
    marks were before they were built on MarkQuery."""

    def __init__(self, outbox) -> None:
        self.outbox = outbox

    def statements(self, limit):
        import sqlalchemy as sa

        t = self.outbox.table
        oldest = sa.select(t.c.id).where(t.c.leader_id.is_(None)).order_by(t.c.id).limit(limit)
        return [sa.update(t).where(t.c.id.in_(oldest.scalar_subquery())).values(leader_id="x")]

    def mark(self, connection, leader_id, limit):  # pragma: no cover - never run
        raise NotImplementedError


def test_the_kit_catches_a_mark_that_ignores_row_filters(monkeypatch: pytest.MonkeyPatch) -> None:
    dialect = load_dialect("mssql")
    monkeypatch.setattr(dialect._hook, "pyharvest_mark_strategy", lambda table: _PlainMark(table))
    sql = compile_mark(dialect)
    with pytest.raises(AssertionError, match="ignores the table's row filters"):
        TestBuiltinDialectsCompiled().test_mark_applies_every_row_filter_in_the_row_choice(sql)
