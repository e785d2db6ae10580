"""The SQL each dialect sends, compiled offline: SQL Server and Oracle have no server here,
so their statements are checked as text against SQLAlchemy's own dialects."""

from __future__ import annotations

import re

import sqlalchemy as sa
from sqlalchemy.dialects import mssql, mysql, oracle, postgresql, sqlite

from pyharvest.bindings.sql import OutboxTable, parse_table_name, schema_ddl
from pyharvest.bindings.sql.binding import SqlBinding
from pyharvest.bindings.sql.quarantine import QuarantineTable
from pyharvest.plugins.api import MarkQuery, ReturningMark, TransactionalMark, load_dialect


def flat(sql: object) -> str:
    return re.sub(r"\s+", " ", str(sql)).strip()


def compiled(stmt: sa.ClauseElement, dialect: sa.Dialect) -> str:
    return flat(stmt.compile(dialect=dialect))


def binding_statements(name: str, table: str = "outbox") -> tuple[str, str, sa.Dialect]:
    """Purge and reset as the binding builds them, compiled for the dialect (no engine needed)."""
    dialect = load_dialect(name)
    outbox = OutboxTable.build(parse_table_name(table))
    b = SqlBinding.__new__(SqlBinding)
    SqlBinding.__init__(b, sa.create_engine("sqlite://"), outbox, dialect, marker=TransactionalMark(MarkQuery(outbox)))
    d = {"mssql": mssql.dialect(), "oracle": oracle.dialect(), "postgresql": postgresql.dialect()}[name]
    out = (compiled(b._purge, d), compiled(b._reset, d), d)
    b.dispose()
    return out


def mark_statements(name: str, outbox: OutboxTable, limit: int, dialect: sa.Dialect) -> list[str]:
    return [compiled(st, dialect) for st in load_dialect(name).mark_strategy(outbox).statements(limit)]


def quarantined(table: str) -> OutboxTable:
    outbox = OutboxTable.build(parse_table_name(table))
    return outbox.where(QuarantineTable.for_outbox(outbox).row_filter)


class TestSqlServer:
    def test_mark_is_one_update_with_output_a_top_and_waiting_locks(self) -> None:
        (sql,) = mark_statements("mssql", OutboxTable.build(parse_table_name("dbo.order")), 100, mssql.dialect())
        assert sql == (
            "UPDATE dbo.[order] SET leader_id=:leader_id OUTPUT inserted.id, inserted.create_time, "
            "inserted.kafka_topic, inserted.kafka_key, inserted.kafka_value, inserted.kafka_headers, "
            "inserted.leader_id WHERE dbo.[order].id IN (SELECT TOP __[POSTCOMPILE_param_1] oldest.id "
            "FROM dbo.[order] AS oldest WITH (UPDLOCK, ROWLOCK) "
            "WHERE oldest.id > :after AND (oldest.leader_id IS NULL OR oldest.leader_id != :leader_id) ORDER BY oldest.id)"
        )
        assert "READPAST" not in sql  # never skip a locked (older) row

    def test_mark_excludes_quarantined_keys(self) -> None:
        # The bug this closes: the hand-written mark ignored poisonPolicy: quarantine.
        (sql,) = mark_statements("mssql", quarantined("dbo.order"), 100, mssql.dialect())
        assert (
            "WHERE oldest.id > :after AND (oldest.leader_id IS NULL OR oldest.leader_id != :leader_id) AND NOT (EXISTS (SELECT * "
            "FROM dbo.order_quarantine WHERE dbo.order_quarantine.kafka_key = oldest.kafka_key)) ORDER BY oldest.id)"
        ) in sql

    def test_mark_statement_compiles_for_pymssql_with_a_literal_top(self) -> None:
        outbox = OutboxTable.build(parse_table_name("outbox"))
        (stmt,) = load_dialect("mssql").mark_strategy(outbox).statements(7)
        c = stmt.compile(dialect=mssql.dialect(paramstyle="pyformat"))
        assert "%(leader_id)s" in str(c) and ":leader_id" not in str(c)
        assert "TOP __[POSTCOMPILE_param_1]" in str(c) and c.binds["param_1"].value == 7  # rendered TOP 7 at execution
        assert [col.name for col in stmt.exported_columns] == [col.name for col in outbox.columns]

    def test_purge_and_reset_use_an_expanding_in_list(self) -> None:
        purge, reset, _ = binding_statements("mssql", "order")
        assert purge == "DELETE FROM [order] WHERE [order].id IN (__[POSTCOMPILE_ids])"
        assert reset == "UPDATE [order] SET leader_id=NULL WHERE [order].id IN (__[POSTCOMPILE_ids])"

    def test_ddl(self) -> None:
        ddl = flat(schema_ddl("mssql", "sales.order"))
        assert ddl.startswith("IF OBJECT_ID(N'sales.[order]', N'U') IS NULL CREATE TABLE sales.[order] (")
        for fragment in (
            "id BIGINT NOT NULL IDENTITY(1,1)",
            "PRIMARY KEY (id)",  # SQL Server clusters a table on its primary key by default
            "create_time DATETIMEOFFSET(6) NOT NULL DEFAULT SYSDATETIMEOFFSET()",
            "kafka_topic VARCHAR(249) NOT NULL",
            "kafka_key NVARCHAR(255) NOT NULL",
            "kafka_value VARBINARY(max) NULL",
            "kafka_headers VARCHAR(max) NOT NULL DEFAULT '[]'",
            "leader_id VARCHAR(36) NULL",
        ):
            assert fragment in ddl


class TestOracle:
    def test_mark_updates_the_row_choice_returning_ids_then_reads_back(self) -> None:
        update, read_back = mark_statements("oracle", OutboxTable.build(parse_table_name("app.outbox")), 50, oracle.dialect())
        assert update == (
            "UPDATE app.outbox SET leader_id=:leader_id WHERE app.outbox.id IN (SELECT app.outbox.id FROM app.outbox "
            "WHERE app.outbox.id > :after AND (app.outbox.leader_id IS NULL OR app.outbox.leader_id != :leader_id) "
            "ORDER BY app.outbox.id "
            "FETCH FIRST 50 ROWS ONLY) RETURNING app.outbox.id INTO :ret_0"
        )
        assert read_back.startswith("SELECT app.outbox.id, app.outbox.create_time, app.outbox.kafka_topic")
        assert "WHERE app.outbox.id IN (__[POSTCOMPILE_ids])" in read_back

    def test_mark_excludes_quarantined_keys(self) -> None:
        update, _ = mark_statements("oracle", quarantined("outbox"), 50, oracle.dialect())
        assert (
            "AND NOT (EXISTS (SELECT * FROM outbox_quarantine WHERE outbox_quarantine.kafka_key = outbox.kafka_key)) "
            "ORDER BY outbox.id FETCH FIRST 50 ROWS ONLY)"
        ) in update

    def test_reserved_word_table_is_quoted(self) -> None:
        update, _ = mark_statements("oracle", OutboxTable.build(parse_table_name("order")), 1, oracle.dialect())
        assert update.startswith('UPDATE "order" SET')

    def test_purge_and_reset_compile(self) -> None:
        purge, reset, _ = binding_statements("oracle")
        assert purge == "DELETE FROM outbox WHERE outbox.id IN (__[POSTCOMPILE_ids])"
        assert reset == "UPDATE outbox SET leader_id=NULL WHERE outbox.id IN (__[POSTCOMPILE_ids])"

    def test_ddl(self) -> None:
        ddl = flat(schema_ddl("oracle", "outbox"))
        for fragment in (
            "CREATE TABLE outbox (",
            "id NUMBER(19) GENERATED BY DEFAULT AS IDENTITY",
            "PRIMARY KEY (id)",
            "create_time TIMESTAMP WITH TIME ZONE DEFAULT SYSTIMESTAMP NOT NULL",  # Oracle's precision: 6
            "kafka_key NVARCHAR2(255) NOT NULL",
            "kafka_value BLOB",
            "kafka_headers CLOB DEFAULT '[]' NOT NULL",
            "leader_id VARCHAR2(36 CHAR)",
        ):
            assert fragment in ddl


class TestReturningAndGenericMarks:
    def test_postgresql_mark_is_one_statement_with_literal_limit_and_for_update(self) -> None:
        outbox = OutboxTable.build(parse_table_name("outbox"))
        (sql,) = mark_statements("postgresql", outbox, 25, postgresql.dialect())
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
        sql = compiled(TransactionalMark(MarkQuery(outbox)).statements(10)[0], mysql.dialect())
        assert sql == (
            "SELECT outbox.id FROM outbox WHERE outbox.id > %s AND (outbox.leader_id IS NULL OR outbox.leader_id != %s) "
            "ORDER BY outbox.id LIMIT 10 FOR UPDATE"
        )

    def test_sqlite_mark_needs_no_lock_clause(self) -> None:
        outbox = OutboxTable.build(parse_table_name("outbox"))
        (sql,) = mark_statements("sqlite", outbox, 3, sqlite.dialect())
        assert "FOR UPDATE" not in sql and "LIMIT 3" in sql and "RETURNING" in sql

    def test_limit_is_always_an_integer_literal(self) -> None:
        outbox = OutboxTable.build(parse_table_name("outbox"))
        sql = compiled(ReturningMark(MarkQuery(outbox)).statement(True + 4), postgresql.dialect())
        assert "LIMIT 5 " in sql
