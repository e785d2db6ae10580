"""Compiled-level conformance for dialect plugins: no server needed.

What a dialect's mark must do for per-key order is checked on the SQL it would send,
compiled for its database by SQLAlchemy: the row choice excludes quarantined keys (and every
other row filter of the table), orders by id, takes at most the limit, and never skips a
locked row. This is the only net under databases that cannot run where the tests run (SQL
Server and Oracle here); the live :class:`~pyharvest.testing.conformance.DialectConformance`
runs wherever a server exists.

A dialect author adds, beside the live suite::

    from pyharvest.testing.compiled import CompiledConformance

    class TestMyDialectCompiled(CompiledConformance):
        @pytest.fixture
        def conformance_dialect(self):
            return "mydialect"

The checks read the compiled text structurally: they find the ``SELECT`` that carries the
``ORDER BY`` on the id (the row choice) and look inside *that* select, at any depth, for the
filters; a filter applied elsewhere (say, to a read-back) does not count.
"""

from __future__ import annotations

import re

import pytest
import sqlalchemy as sa

from pyharvest.plugins.api import Dialect, MarkStrategy, OutboxTable, load_dialect, parse_table_name

__all__ = ["CompiledConformance", "MarkSql", "compile_mark"]

# A row filter whose rendering nothing else can produce: where it shows, the filter was applied.
SENTINEL = "pyharvest_conformance_sentinel"
_SKIPPING = re.compile(r"\b(SKIP\s+LOCKED|READPAST|NOWAIT|READ\s+PAST)\b", re.I)
_ORDER_BY_ID = re.compile(r"\bORDER\s+BY\s+(?:[\w\"`\[\].]+\.)?[\"`\[]?id[\"`\]]?(?:\s+ASC)?\b(?!\s+DESC)", re.I)


def _sentinel_filter(source: sa.FromClause) -> sa.ColumnElement[bool]:
    return source.c.kafka_key != sa.literal_column(f"'{SENTINEL}'")


class MarkSql:
    """A dialect's mark statements compiled for its database, with questions about them."""

    def __init__(self, statements: list[str]) -> None:
        self.statements = statements

    @property
    def text(self) -> str:
        return "\n;\n".join(self.statements)

    def row_choice(self) -> str:
        """The ``SELECT … ORDER BY id`` that chooses the rows (with everything nested in it).
        Fails when no statement orders by id, or more than one does."""
        found = [_enclosing_select(sql, m.start()) for sql in self.statements for m in _ORDER_BY_ID.finditer(sql)]
        assert found, f"no statement of the mark orders by id:\n{self.text}"
        assert len(found) == 1, f"more than one statement orders by id; which chooses the rows?\n{self.text}"
        return found[0]


def _enclosing_select(sql: str, at: int) -> str:
    """The text of the innermost ``SELECT`` enclosing position ``at``, from its keyword to
    where its parenthesis closes (or the statement ends)."""
    depth = 0
    start = 0
    for i in range(at - 1, -1, -1):
        ch = sql[i]
        if ch == ")":
            depth += 1
        elif ch == "(":
            if depth == 0:
                start = i + 1
                break
            depth -= 1
    select = re.search(r"\bSELECT\b", sql[start:at], re.I)
    assert select is not None, f"ORDER BY id outside a SELECT:\n{sql}"
    begin = start + select.start()
    depth = 0
    for j in range(begin, len(sql)):
        if sql[j] == "(":
            depth += 1
        elif sql[j] == ")":
            if depth == 0:
                return sql[begin:j]
            depth -= 1
    return sql[begin:]


def compile_mark(
    dialect: Dialect,
    *,
    limit: int = 37,
    table: str = "outbox",
    sa_dialect: sa.Dialect | None = None,
    sentinel: bool = True,
) -> MarkSql:
    """The statements of ``dialect``'s mark for an outbox with a sentinel row filter, compiled."""
    outbox = OutboxTable.build(parse_table_name(table))
    if sentinel:
        outbox = outbox.where(_sentinel_filter)
    strategy = dialect.mark_strategy(outbox)
    assert isinstance(strategy, MarkStrategy)
    target = sa_dialect or dialect.sqlalchemy_dialect()
    out: list[str] = []
    for stmt in strategy.statements(limit):
        compiled = stmt.compile(dialect=target)  # type: ignore[attr-defined]
        text = str(compiled)
        for name, bind in compiled.binds.items():
            if not bind.expanding and isinstance(bind.value, int):
                text = text.replace(f"__[POSTCOMPILE_{name}]", str(bind.value))  # TOP n, FETCH FIRST n
        out.append(re.sub(r"\s+", " ", text))
    return MarkSql(out)


class CompiledConformance:
    """The mark's row choice, checked on the compiled SQL. Provide ``conformance_dialect``;
    ``conformance_sqlalchemy_dialect`` when the plugin names no SQLAlchemy backend."""

    @pytest.fixture
    def conformance_sqlalchemy_dialect(self) -> sa.Dialect | None:
        return None

    @pytest.fixture
    def compiled_dialect(self, conformance_dialect: str) -> Dialect:
        return load_dialect(conformance_dialect)

    @pytest.fixture
    def mark_sql(self, compiled_dialect: Dialect, conformance_sqlalchemy_dialect: sa.Dialect | None) -> MarkSql:
        return compile_mark(compiled_dialect, sa_dialect=conformance_sqlalchemy_dialect)

    def test_mark_chooses_rows_in_id_order(self, mark_sql: MarkSql) -> None:
        choice = mark_sql.row_choice()
        assert not re.search(r"\bDESC\b", choice, re.I), f"the row choice orders by descending id:\n{choice}"

    def test_mark_takes_at_most_the_limit_in_the_row_choice(self, mark_sql: MarkSql) -> None:
        choice = mark_sql.row_choice()
        assert re.search(r"\b(LIMIT|TOP|FETCH\s+FIRST)\s*\(?\s*37\b", choice, re.I), (
            f"the row choice does not limit itself to 37 rows:\n{choice}"
        )

    def test_mark_applies_every_row_filter_in_the_row_choice(self, mark_sql: MarkSql) -> None:
        # Quarantined keys today, shards next: a filter outside the row choice would let a
        # parked key's later records be marked past its poison record.
        choice = mark_sql.row_choice()
        assert SENTINEL in choice, f"the row choice ignores the table's row filters:\n{mark_sql.text}"

    def test_mark_excludes_quarantined_keys(
        self, compiled_dialect: Dialect, conformance_sqlalchemy_dialect: sa.Dialect | None
    ) -> None:
        from pyharvest.bindings.sql.quarantine import QuarantineTable

        outbox = OutboxTable.build(parse_table_name("outbox"))
        q = QuarantineTable.for_outbox(outbox)
        strategy = compiled_dialect.mark_strategy(outbox.where(q.row_filter))
        target = conformance_sqlalchemy_dialect or compiled_dialect.sqlalchemy_dialect()
        statements = [re.sub(r"\s+", " ", str(s.compile(dialect=target))) for s in strategy.statements(5)]  # type: ignore[attr-defined]
        choice = MarkSql(statements)
        assert re.search(r"NOT \(?EXISTS \(SELECT .* FROM outbox_quarantine\b", choice.row_choice(), re.I), (
            f"the row choice does not exclude quarantined keys:\n{choice.text}"
        )

    def test_mark_only_takes_rows_not_marked_by_this_leader(self, mark_sql: MarkSql) -> None:
        choice = mark_sql.row_choice()
        assert re.search(r"leader_id IS NULL OR .*leader_id (!=|<>)", choice, re.I), (
            f"the row choice does not skip this leader's own marks:\n{choice}"
        )

    def test_mark_never_skips_a_locked_row(self, mark_sql: MarkSql) -> None:
        # Skipping an older row of a key that another transaction has locked would publish the key's
        # newer row first.
        found = _SKIPPING.search(mark_sql.text)
        assert found is None, f"the mark skips or refuses locked rows ({found.group(0)}):\n{mark_sql.text}"
