"""One upsert-from-select construct, compiled per dialect.

SQLAlchemy has no construct for "insert these selected rows, updating the rows whose keys
exist": PostgreSQL and SQLite spell it ``INSERT … ON CONFLICT``, MySQL ``ON DUPLICATE KEY
UPDATE``, SQL Server and Oracle ``MERGE``. The first three have SQLAlchemy constructs, which
their plugins return. :class:`UpsertFromSelect` is the construct for the rest, written once:
its default compilation is the SQL standard's ``MERGE``, and a plugin registers its database's
spelling for its SQLAlchemy dialect with ``@compiles(UpsertFromSelect, name)`` (SQLAlchemy's
way of compiling one construct differently per database), calling :func:`compile_merge` with
a :class:`MergeForm`: SQL Server's and Oracle's are two forms of one function.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.base import Executable
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.elements import ClauseElement

__all__ = ["MergeForm", "UpsertFromSelect", "compile_merge", "compile_merges_as"]


class UpsertFromSelect(Executable, ClauseElement):
    """Insert ``source``'s rows into ``target``, except that a row whose ``keys`` match a row
    of ``target`` updates that row's other columns; among ``source`` rows sharing keys, the
    last in ``order`` wins. ``source`` selects ``target``'s columns by name, without an
    ``ORDER BY``."""

    inherit_cache = False

    def __init__(
        self, target: sa.Table, source: sa.Select[Any], keys: Sequence[str], order: Sequence[sa.ColumnElement[Any]]
    ) -> None:
        self.target = target
        self.source = source
        self.keys = list(keys)
        self.order = list(order)

    @property
    def names(self) -> list[str]:
        """The columns written, in ``source``'s order."""
        return [c.name for c in self.source.selected_columns]

    @property
    def others(self) -> list[str]:
        """The columns a matched row has updated: every one but the keys."""
        return [c for c in self.names if c not in self.keys]

    def latest(self) -> sa.Select[Any]:
        """``source`` with each key's last row only (``ROW_NUMBER()``): what a ``MERGE``
        reads, as it may not touch a target row twice."""
        rank = sa.func.row_number().over(
            partition_by=[self.source.selected_columns[k] for k in self.keys],
            order_by=[o.desc() for o in self.order],
        )
        ranked = self.source.add_columns(rank.label("pyharvest_rank")).subquery("ranked")
        return sa.select(*(ranked.c[n] for n in self.names)).where(ranked.c.pyharvest_rank == 1)


@dataclass(frozen=True)
class MergeForm:
    """How a database spells the standard ``MERGE``."""

    #: After the target's name: SQL Server's ``WITH (HOLDLOCK)`` keeps a concurrent insert of
    #: the same key from slipping between the match and the insert.
    target_hint: str = ""
    #: ``AS`` before an alias (Oracle refuses it).
    alias_as: bool = True
    #: The match condition in parentheses (Oracle requires them).
    parenthesised_match: bool = False
    #: ``SET tgt.c = …`` and ``INSERT (tgt.c, …)`` rather than bare column names.
    qualified_columns: bool = False
    #: ``WHEN NOT MATCHED`` (the standard), or SQL Server's ``WHEN NOT MATCHED BY TARGET``.
    not_matched: str = "WHEN NOT MATCHED"
    #: What ends the statement (SQL Server requires ``;``).
    terminator: str = ""


def compile_merge(element: UpsertFromSelect, compiler: SQLCompiler, form: MergeForm, **kw: Any) -> str:
    """``MERGE INTO target USING (each key's last row) src ON keys WHEN MATCHED THEN UPDATE …
    WHEN NOT MATCHED THEN INSERT …`` in ``form``'s spelling. The source's values are rendered
    inline, as the statement is run once per job with the parameters already in the select."""
    q = compiler.preparer.quote
    alias = " AS " if form.alias_as else " "
    latest = compiler.process(element.latest(), literal_binds=True, **kw)
    on = " AND ".join(f"tgt.{q(k)} = src.{q(k)}" for k in element.keys)
    if form.parenthesised_match:
        on = f"({on})"
    prefix = "tgt." if form.qualified_columns else ""
    update = (
        f" WHEN MATCHED THEN UPDATE SET {', '.join(f'{prefix}{q(c)} = src.{q(c)}' for c in element.others)}"
        if element.others else ""
    )
    names = element.names
    return (
        f"MERGE INTO {compiler.preparer.format_table(element.target)}{form.target_hint}{alias}tgt "
        f"USING ({latest}){alias}src ON {on}{update} "
        f"{form.not_matched} THEN INSERT ({', '.join(f'{prefix}{q(c)}' for c in names)}) "
        f"VALUES ({', '.join(f'src.{q(c)}' for c in names)}){form.terminator}"
    )


def compile_merges_as(dialect_name: str, form: MergeForm) -> None:
    """Compile :class:`UpsertFromSelect` as ``form``'s ``MERGE`` for the SQLAlchemy dialect
    named ``dialect_name`` (a dialect plugin's ``DialectOptions.merge``, registered when it loads)."""

    def merge(element: UpsertFromSelect, compiler: SQLCompiler, **kw: Any) -> str:
        return compile_merge(element, compiler, form, **kw)

    compiles(UpsertFromSelect, dialect_name)(merge)


@compiles(UpsertFromSelect)
def _standard_merge(element: UpsertFromSelect, compiler: SQLCompiler, **kw: Any) -> str:
    return compile_merge(element, compiler, MergeForm(), **kw)
