"""Every statement the harvester runs on an outbox, built once per table and dialect.

:class:`OutboxStatements` holds purge, reset, the backlog count and the oldest row's age for the binding;
:func:`harvester_statements` compiles those, the mark and the quarantine's statements for a
database without connecting to it (``reaper schema --statements``): a DBA can review what
will run, and the SQL of databases that cannot run here becomes visible.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from pyharvest.bindings.sql.quarantine import QuarantineTable
from pyharvest.plugins.api import Dialect, OutboxTable

__all__ = ["OutboxStatements", "harvester_statements"]

@dataclass(frozen=True, eq=False)
class OutboxStatements:
    """Purge, reset and count on one outbox table, in the dialect's form (its list filter)."""

    purge: sa.Delete
    reset: sa.Update
    #: A deposed leader's late reset must not unmark rows its successor has marked since.
    reset_own: sa.Update
    count: sa.Select[Any]
    #: The oldest row's ``create_time``: one look-up through the primary key's index.
    oldest: sa.Select[Any]

    @classmethod
    def build(cls, outbox: OutboxTable, dialect: Dialect) -> OutboxStatements:
        where = dialect.list_filter(outbox.id, "ids")
        own = outbox.leader_id == sa.bindparam("own_leader_id", type_=outbox.leader_id.type)
        return cls(
            purge=sa.delete(outbox.table).where(where),
            reset=sa.update(outbox.table).where(where).values(leader_id=sa.null()),
            reset_own=sa.update(outbox.table).where(where, own).values(leader_id=sa.null()),
            count=sa.select(sa.func.count()).select_from(outbox.table),
            oldest=sa.select(outbox.table.c.create_time).order_by(outbox.id).limit(1),
        )


def harvester_statements(
    dialect: Dialect, outbox: OutboxTable, *, quarantine: bool = False, limit: int = 1000, shards: int = 1
) -> list[tuple[str, str]]:
    """``(what, SQL)`` for every statement the harvester runs on ``outbox``, compiled for the
    dialect's database with sample parameters; ``quarantine`` as with ``poisonPolicy: quarantine``;
    ``shards`` > 1 shows the shard index and the mark of shard 0 (the others differ only in
    the shard number)."""
    target = dialect.sqlalchemy_dialect()
    out: list[tuple[str, str]] = []
    marked = outbox
    if shards > 1:
        from pyharvest.bindings.sql.schema import shard_index_name

        outbox = marked = OutboxTable.build(outbox.name, outbox.layout, key_hash=True)
        index = shard_index_name(outbox.name, shards)
        out += [(f"shard index for {shards} shards (reaper init-db --shards {shards})", ddl)
                for ddl in dialect.shard_ddl(outbox, shards, index)]
        marked = outbox.where(functools.partial(dialect.shard_filter, shards=shards, shard=0))
    q = QuarantineTable.for_outbox(outbox) if quarantine else None
    if q is not None:
        marked = marked.where(q.row_filter)
    what = "mark" if shards == 1 else f"mark of shard 0 of {shards}"
    for n, stmt in enumerate(dialect.mark_strategy(marked).statements(limit), start=1):
        out.append((f"{what} ({n} of a mark's statements, limit {limit})", _compile(stmt, target)))
    s = OutboxStatements.build(outbox, dialect)
    out += [
        ("purge (acknowledged records)", _compile(s.purge, target)),
        ("reset (failed records, remarked under a new leader id)", _compile(s.reset, target)),
        ("reset by a leader of its own marks only", _compile(s.reset_own, target)),
        ("backlog count", _compile(s.count, target)),
        ("the oldest row's create_time (pyharvest_oldest_record_age_seconds)", _compile(s.oldest, target)),
    ]
    if q is not None:
        key = sa.bindparam("kafka_key", type_=q.key.type)
        discard = sa.delete(outbox.table).where(outbox.id == sa.bindparam("record_id"), outbox.table.c.kafka_key == key)
        out += [
            ("quarantine: park a key", _compile(sa.insert(q.table), target)),
            ("quarantine: lift a key (replay)", _compile(sa.delete(q.table).where(q.key == key), target)),
            ("quarantine: discard the poison record", _compile(discard, target)),
        ]
    return out


def _compile(statement: sa.Executable, dialect: sa.Dialect) -> str:
    compiled = statement.compile(dialect=dialect)  # type: ignore[attr-defined]  # every statement here is a ClauseElement

    def expand(m: re.Match[str]) -> str:
        # A literal rendered at execution (SQL Server's TOP n) shows its value; an expanding
        # list (purge's ids) shows as the list of parameters it becomes.
        bind = compiled.binds[m.group(1)]
        if bind.expanding:
            return ", ".join(f"{m.group(1)}_{i}" for i in (1, 2, 3))
        return str(int(bind.value)) if isinstance(bind.value, int) else repr(bind.value)

    text = re.sub(r"__\[POSTCOMPILE_(\w+)\]", expand, str(compiled))
    if dialect.paramstyle in ("format", "pyformat"):
        # The driver's escape of a literal % (a modulo), not SQL: a DBA reads or runs the SQL itself.
        text = text.replace("%%", "%")
    return re.sub(r"[ \t]*\n[ \t]*", "\n", text).strip()
