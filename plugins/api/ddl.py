"""The outbox table's DDL, compiled from its one description.

The table is described once, as the Core table of :class:`~pyharvest.plugins.api.OutboxTable`
(its columns, types, nullability and the server defaults a row written by hand relies on). A
dialect states only what its database does differently: a column type (MySQL's ``LONGBLOB``,
SQL Server's ``VARBINARY(MAX)``), a server default (``SYSDATETIMEOFFSET()``), how ids are
generated (an ``IDENTITY`` clause, ``AUTO_INCREMENT``, SQLite's ``AUTOINCREMENT``) and the
table's options (SQLAlchemy's dialect keywords: ``postgresql_with``, ``mysql_collate``,
``sqlite_autoincrement``). :func:`create_table_ddl` compiles ``CREATE TABLE`` from both with
SQLAlchemy's :class:`~sqlalchemy.schema.CreateTable`, as SQLAlchemy's own dialects render one
table for every database.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa
from sqlalchemy.schema import CreateTable

from pyharvest.plugins.api.table import NATIVE, OutboxTable

__all__ = ["TableOptions", "create_table_ddl"]


@dataclass(frozen=True)
class TableOptions:
    """What a dialect's ``CREATE TABLE`` changes of the table's description."""

    #: Column types that differ from the description's rendering, by column name.
    types: Mapping[str, sa.types.TypeEngine[Any]] = field(default_factory=dict)
    #: Server defaults (SQL) that differ from the description's, by column; None drops one.
    defaults: Mapping[str, str | None] = field(default_factory=dict)
    #: The id's ``IDENTITY`` clause; None where the database generates ids otherwise
    #: (``AUTO_INCREMENT``, SQLite's rowid), which SQLAlchemy renders from the primary key.
    identity: sa.Identity | None = None
    #: SQLAlchemy's dialect keyword arguments of the table (``mysql_engine``, ``postgresql_with``…).
    table_kwargs: Mapping[str, Any] = field(default_factory=dict)
    #: ``CREATE TABLE IF NOT EXISTS``, where the database has it.
    if_not_exists: bool = True
    #: Where it has not: SQL put before ``CREATE TABLE`` that runs it only while the table is
    #: missing (SQL Server's ``IF OBJECT_ID(N'{table}', N'U') IS NULL``); ``{table}`` is the
    #: table's quoted name.
    if_missing: str | None = None


def create_table_ddl(table: OutboxTable, dialect: sa.Dialect, options: TableOptions) -> str:
    """``CREATE TABLE`` for ``table`` (the native layout with its key hash column), compiled
    for ``dialect`` with ``options``."""
    described = OutboxTable.build(table.name, table.layout, key_hash=table.layout == NATIVE).table
    columns = []
    for c in described.columns:
        default = options.defaults.get(c.name, _default_text(c))
        extra: list[Any] = [options.identity._copy()] if c.primary_key and options.identity is not None else []
        columns.append(sa.Column(
            c.name, options.types.get(c.name, c.type), *extra, primary_key=c.primary_key, nullable=c.nullable,
            autoincrement=c.autoincrement, server_default=None if default is None else sa.text(default),
        ))
    ddl_table = sa.Table(described.name, sa.MetaData(), *columns, schema=described.schema, **options.table_kwargs)
    ddl = _tidy(str(CreateTable(ddl_table, if_not_exists=options.if_not_exists).compile(dialect=dialect)))
    if options.if_missing is not None:
        ddl = options.if_missing.format(table=table.name.quoted(dialect.identifier_preparer)) + "\n" + ddl
    return ddl


def _tidy(ddl: str) -> str:
    """SQLAlchemy's rendering, laid out for a reader of ``reaper schema``: one column a line,
    names aligned, no trailing blanks, table options on the closing line."""
    lines = [line.strip() for line in ddl.strip().splitlines()]
    tidy: list[str] = []
    for line in lines:
        if tidy and tidy[-1].startswith(")") and not line.startswith(")"):
            tidy[-1] += " " + line
        else:
            tidy.append(line)
    if len(tidy[-1]) > 1:
        tidy[-1] = ") " + tidy[-1][1:].lstrip()  # MySQL's options follow the parenthesis at once
    body = [i for i, line in enumerate(tidy) if 0 < i < len(tidy) - 1 and not line.startswith("PRIMARY KEY")]
    width = max((len(tidy[i].split(" ", 1)[0]) for i in body), default=0) + 1
    for i in body:
        name, _, rest = tidy[i].partition(" ")
        tidy[i] = f"{name:<{width}}{rest}"
    return "\n".join(line if i in (0, len(tidy) - 1) else "  " + line for i, line in enumerate(tidy))


def _default_text(column: sa.Column[Any]) -> str | None:
    """The description's server default of ``column``, as SQL."""
    default = column.server_default
    if default is None:
        return None
    arg = getattr(default, "arg", None)
    if isinstance(arg, str):
        return "'" + arg.replace("'", "''") + "'"
    return str(arg.compile()) if arg is not None else None
