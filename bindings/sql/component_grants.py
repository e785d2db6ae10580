"""The database privileges each component needs, and nothing more; ``init-db`` (the tables'
owner) does all the DDL.

=============  =====================================================================
``reaper``     the outbox: ``SELECT``, ``UPDATE`` (mark, reset), ``DELETE`` (purge);
               ``INSERT`` too with ``shards`` > 1 (the start-up check inserts a row
               without a key hash, in a transaction it rolls back, to see it refused);
               ``poisonPolicy: quarantine``: ``SELECT``, ``INSERT`` on the quarantine
               table (the mark reads it, a poison record's key is parked in it).
               PostgreSQL's ``LISTEN`` (the change feed) needs no grant.
``stasher``    the outbox: ``INSERT`` (``COPY`` and ``pg_notify`` need nothing more).
``verify``     nothing: ``reaper verify`` reads Kafka only.
=============  =====================================================================

The inbox's are the inbox's (:func:`pyharvest.bindings.sql.inbox.tables.InboxTables.grants`). The same
description prints the ``GRANT`` statements (``reaper schema --grants``) and finds a missing
one: at start by a probe of each privilege that changes nothing (:func:`check_grants`), or at
first use by the database's refusal (:func:`refused_grant`); either way the error names the
privilege, the table and the ``GRANT`` that gives it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import sqlalchemy as sa

from pyharvest.bindings.sql.quarantine import QuarantineTable
from pyharvest.core.errors import MissingGrantError
from pyharvest.plugins.api import (
    GOHARVEST,
    Dialect,
    OutboxTable,
    grant_statements,
    is_privilege_error,
    privilege_probe,
)

__all__ = [
    "COMPONENTS",
    "Grant",
    "check_grants",
    "component_grants",
    "grants_script",
    "missing_grant",
    "refused_grant",
]

#: What ``reaper schema --grants`` knows, besides ``inbox``.
COMPONENTS = ("reaper", "stasher", "verify")


@dataclass(frozen=True)
class Grant:
    """Privileges one component needs on one table, and what for. ``serial_id``: the table's
    id is generated without ``IDENTITY`` (inserting may also need its sequence)."""

    privileges: tuple[str, ...]
    table: sa.Table
    why: str
    serial_id: bool = False

    @property
    def table_name(self) -> str:
        return f"{self.table.schema}.{self.table.name}" if self.table.schema else self.table.name


def component_grants(component: str, outbox: OutboxTable, *, quarantine: bool = False, shards: int = 1) -> list[Grant]:
    """What ``component`` (one of :data:`COMPONENTS`) needs on ``outbox``; ``quarantine`` and
    ``shards`` as the harvester runs (``poisonPolicy``, ``shards``)."""
    serial = outbox.layout == GOHARVEST  # goharvest's table: BIGSERIAL ids
    if component == "reaper":
        privileges = ("SELECT", "UPDATE", "DELETE", *(("INSERT",) if shards > 1 else ()))
        why = "marking, resetting and purging records" + (
            "; INSERT: the start-up check that the table refuses rows without a key hash (one row, rolled back)"
            if shards > 1 else ""
        )
        out = [Grant(privileges, outbox.table, why)]
        if quarantine:
            q = QuarantineTable.for_outbox(outbox).table
            out.append(Grant(("SELECT", "INSERT"), q, "skipping quarantined keys and parking a poison record's key"))
        return out
    if component == "stasher":
        return [Grant(("INSERT",), outbox.table, "stashing records", serial_id=serial)]
    if component == "verify":
        return []
    raise ValueError(f"unknown component {component!r}; expected one of {', '.join(COMPONENTS)}, inbox")


def grants_script(dialect: Dialect, grants: Sequence[Grant], role: str, component: str) -> str:
    """The ``GRANT`` statements, each after a comment saying what it is for."""
    if not dialect.capabilities.grants:
        return f"-- {dialect.name} has no roles or grants: the database file's permissions decide what one may do\n"
    if not grants:
        return f"-- reaper {component} needs no privilege on the database: it reads Kafka only\n"
    lines: list[str] = []
    for g in grants:
        lines.append(f"-- {g.why}")
        statements = grant_statements(dialect, g.table, g.privileges, role, serial_id=g.serial_id)
        lines += [f"{s};" for s in statements if f"{s};" not in lines]  # a schema's USAGE once
    return "\n".join(lines) + "\n"


def _who(engine: sa.Engine) -> str:
    return engine.url.username or "the connecting role"


def missing_grant(
    engine: sa.Engine, dialect: Dialect, grant: Grant, privilege: str, component: str, detail: str
) -> MissingGrantError:
    """The error for ``privilege`` on ``grant``'s table, refused to the engine's role."""
    role = _who(engine)
    statements = "; ".join(grant_statements(dialect, grant.table, (privilege,), role, serial_id=grant.serial_id))
    return MissingGrantError(
        f"the database refused {privilege} on {grant.table_name} to {role!r} ({detail}), which the {component} "
        f"needs for {grant.why}: {statements} (`reaper schema --binding {dialect.name} --grants {component} "
        f"--role ROLE` prints every grant it needs)",
        privilege, grant.table_name, role,
    )


def check_grants(engine: sa.Engine, dialect: Dialect, grants: Sequence[Grant], component: str) -> None:
    """Fail at start, naming the first privilege refused: each is probed with a statement
    that needs it alone and touches no row, in a transaction rolled back."""
    if not dialect.capabilities.grants:
        return
    with engine.connect() as conn:
        for grant in grants:
            for privilege in grant.privileges:
                trans = conn.begin()
                try:
                    conn.execute(privilege_probe(grant.table, privilege))
                except sa.exc.DBAPIError as e:
                    trans.rollback()
                    reason = str(e.orig).strip().splitlines()[0] if e.orig is not None else str(e)
                    raise missing_grant(engine, dialect, grant, privilege, component, reason) from None
                trans.rollback()


def refused_grant(
    error: sa.exc.DBAPIError, engine: sa.Engine, dialect: Dialect, grant: Grant, component: str
) -> MissingGrantError | None:
    """What to raise instead of ``error`` when the database refused one of ``grant``'s
    privileges (the first, when it cannot tell which); None for any other error."""
    if not is_privilege_error(dialect, error):
        return None
    text = str(error.orig if error.orig is not None else error)
    named = [p for p in grant.privileges if p.lower() in text.lower()] or list(grant.privileges)
    return missing_grant(engine, dialect, grant, named[0], component, text.strip().splitlines()[0])
