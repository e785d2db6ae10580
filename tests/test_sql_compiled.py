"""The SQL each dialect sends, compiled offline: SQL Server and Oracle have no server here,
so their statements are checked as text against SQLAlchemy's own dialects."""

from __future__ import annotations

import re

import sqlalchemy as sa
from sqlalchemy.dialects import mssql, mysql, oracle, postgresql, sqlite

from pyharvest.bindings.sql import OutboxTable, parse_table_name, schema_ddl
from pyharvest.bindings.sql.binding import SqlBinding
from pyharvest.bindings.sql.marking import ReturningMark, TransactionalMark
from pyharvest.plugins import mssql as mssql_plugin
from pyharvest.plugins import oracle as oracle_plugin
from pyharvest.plugins.manager import load_dialect


def flat(sql: object) -> str:
    return re.sub(r"\s+", " ", str(sql)).strip()


def compiled(stmt: sa.ClauseElement, dialect: sa.Dialect) -> str:
    return flat(stmt.compile(dialect=dialect))


def binding_statements(name: str, table: str = "outbox") -> tuple[str, str, sa.Dialect]:
    """Purge and reset as the binding builds them, compiled for the dialect (no engine needed)."""
    plugin = load_dialect(name)
    outbox = OutboxTable.build(parse_table_name(table))
    b = SqlBinding.__new__(SqlBinding)
    SqlBinding.__init__(b, sa.create_engine("sqlite://"), outbox, plugin, marker=TransactionalMark(outbox))
    d = {"mssql": mssql.dialect(), "oracle": oracle.dialect(), "postgresql": postgresql.dialect()}[name]
    out = (compiled(b._purge, d), compiled(b._reset, d), d)
    b.dispose()
    return out


class TestSqlServer:
    def test_mark_is_one_cte_update_with_output_and_waiting_locks(self) -> None:
        outbox = OutboxTable.build(parse_table_name("dbo.order"))
        sql = flat(mssql_plugin.mark_sql(outbox, 100))
        assert sql == (
            "WITH oldest AS (SELECT TOP (100) * FROM dbo.[order] WITH (UPDLOCK, ROWLOCK) "
            "WHERE leader_id IS NULL OR leader_id <> :leader_id ORDER BY id) "
            "UPDATE oldest SET leader_id = :leader_id OUTPUT inserted.id, inserted.create_time, "
            "inserted.kafka_topic, inserted.kafka_key, inserted.kafka_value, inserted.kafka_headers, "
            "inserted.leader_id"
        )
        assert "READPAST" not in sql  # never skip a locked (older) row

    def test_mark_statement_compiles_for_pymssql(self) -> None:
        outbox = OutboxTable.build(parse_table_name("outbox"))
        stmt = mssql_plugin.MssqlMark(outbox).statement(7)
        sql = compiled(stmt, mssql.dialect(paramstyle="pyformat"))
        assert "TOP (7)" in sql and "%(leader_id)s" in sql and ":leader_id" not in sql
        assert [c.name for c in stmt.selected_columns] == [c.name for c in outbox.columns]

    def test_purge_and_reset_use_an_expanding_in_list(self) -> None:
        purge, reset, d = binding_statements("mssql", "order")
        assert purge == "DELETE FROM [order] WHERE [order].id IN (__[POSTCOMPILE_ids])"
        assert reset == "UPDATE [order] SET leader_id=NULL WHERE [order].id IN (__[POSTCOMPILE_ids])"

    def test_ddl(self) -> None:
        ddl = flat(schema_ddl("mssql", "sales.order"))
        assert ddl.startswith("IF OBJECT_ID(N'sales.[order]', N'U') IS NULL CREATE TABLE sales.[order] (")
        for fragment in (
            "id BIGINT IDENTITY(1,1) NOT NULL PRIMARY KEY CLUSTERED",
            "create_time DATETIMEOFFSET(6) NOT NULL DEFAULT SYSDATETIMEOFFSET()",
            "kafka_topic VARCHAR(249) NOT NULL",
            "kafka_key NVARCHAR(255) NOT NULL",
            "kafka_value VARBINARY(MAX) NULL",
            "kafka_headers VARCHAR(MAX) NOT NULL DEFAULT '[]'",
            "leader_id VARCHAR(36) NULL",
        ):
            assert fragment in ddl


class TestOracle:
    def test_mark_returns_ids_into_an_array_bind(self) -> None:
        outbox = OutboxTable.build(parse_table_name("app.outbox"))
        assert flat(oracle_plugin.mark_sql(outbox, 50)) == (
            "UPDATE app.outbox SET leader_id = :leader_id WHERE id IN (SELECT id FROM app.outbox "
            "WHERE leader_id IS NULL OR leader_id <> :leader_id ORDER BY id FETCH FIRST 50 ROWS ONLY) "
            "RETURNING id INTO :ids"
        )

    def test_reserved_word_table_is_quoted(self) -> None:
        outbox = OutboxTable.build(parse_table_name("order"))
        assert 'UPDATE "order" SET' in oracle_plugin.mark_sql(outbox, 1)

    def test_read_back_and_purge_compile(self) -> None:
        outbox = OutboxTable.build(parse_table_name("outbox"))
        read_back = compiled(oracle_plugin.OracleMark(outbox)._read_back, oracle.dialect())
        assert read_back.startswith("SELECT outbox.id, outbox.create_time, outbox.kafka_topic")
        assert "WHERE outbox.id IN (__[POSTCOMPILE_ids])" in read_back
        purge, reset, _ = binding_statements("oracle")
        assert purge == "DELETE FROM outbox WHERE outbox.id IN (__[POSTCOMPILE_ids])"
        assert reset == "UPDATE outbox SET leader_id=NULL WHERE outbox.id IN (__[POSTCOMPILE_ids])"

    def test_ddl(self) -> None:
        ddl = flat(schema_ddl("oracle", "outbox"))
        for fragment in (
            "CREATE TABLE outbox (",
            "id NUMBER(19) GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY",
            "create_time TIMESTAMP(6) WITH TIME ZONE DEFAULT SYSTIMESTAMP NOT NULL",
            "kafka_key NVARCHAR2(255) NOT NULL",
            "kafka_value BLOB",
            "kafka_headers CLOB DEFAULT '[]' NOT NULL",
            "leader_id VARCHAR2(36 CHAR)",
        ):
            assert fragment in ddl


class TestReturningAndGenericMarks:
    def test_postgresql_mark_is_one_statement_with_literal_limit_and_for_update(self) -> None:
        outbox = OutboxTable.build(parse_table_name("outbox"))
        marker = load_dialect("postgresql").mark_strategy(outbox)
        sql = compiled(marker.statement(25), postgresql.dialect())  # type: ignore[attr-defined]
        assert sql.startswith(
            "UPDATE outbox SET leader_id=%(leader_id)s::VARCHAR WHERE outbox.id = ANY (array((SELECT outbox.id"
        )
        assert "ORDER BY outbox.id LIMIT 25 FOR UPDATE)))" in sql
        assert "SKIP LOCKED" not in sql
        assert sql.endswith("RETURNING outbox.id, outbox.create_time, outbox.kafka_topic, outbox.kafka_key, "
                            "outbox.kafka_value, outbox.kafka_headers, outbox.leader_id")

    def test_postgresql_purge_binds_one_array(self) -> None:
        purge, reset, _ = binding_statements("postgresql")
        # One text parameter cast by the server: '{1,2,3}'::BIGINT[] (see plugins/postgresql.py).
        assert purge == "DELETE FROM outbox WHERE outbox.id = ANY (CAST(%(ids)s AS BIGINT[]))"
        assert reset == "UPDATE outbox SET leader_id=NULL WHERE outbox.id = ANY (CAST(%(ids)s AS BIGINT[]))"

    def test_generic_mark_locks_and_waits(self) -> None:
        outbox = OutboxTable.build(parse_table_name("outbox"))
        sql = compiled(TransactionalMark(outbox).select_statement(10), mysql.dialect())
        assert sql == (
            "SELECT outbox.id FROM outbox WHERE outbox.leader_id IS NULL OR outbox.leader_id != %s "
            "ORDER BY outbox.id LIMIT 10 FOR UPDATE"
        )

    def test_sqlite_mark_needs_no_lock_clause(self) -> None:
        outbox = OutboxTable.build(parse_table_name("outbox"))
        sql = compiled(ReturningMark(outbox, lock=False).statement(3), sqlite.dialect())
        assert "FOR UPDATE" not in sql and "LIMIT 3" in sql and "RETURNING" in sql

    def test_limit_is_always_an_integer_literal(self) -> None:
        outbox = OutboxTable.build(parse_table_name("outbox"))
        sql = compiled(ReturningMark(outbox).statement(True + 4), postgresql.dialect())
        assert "LIMIT 5 " in sql
