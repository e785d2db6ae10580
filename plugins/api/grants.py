"""Privileges on tables, per database: the ``GRANT`` statements that give them, a statement
that needs one and changes nothing (to find a missing grant at start), and whether an error
is a privilege refused.

What differs between databases is declared as capability flags
(:class:`~pyharvest.plugins.api.Capabilities`: ``grants``, ``account_grantees``,
``schema_usage``, ``serial_sequences``, ``privilege_errors``); the statements are built here,
quoted by the dialect's own identifier rules.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import sqlalchemy as sa

from pyharvest.plugins.api.error_codes import error_codes

if TYPE_CHECKING:
    from pyharvest.plugins.api.dialect import Dialect

__all__ = ["PRIVILEGES", "grant_statements", "is_privilege_error", "privilege_probe"]

#: The table privileges pyharvest's components need, in the order statements list them.
PRIVILEGES = ("SELECT", "INSERT", "UPDATE", "DELETE")


def _grantee(dialect: Dialect, grantee: str) -> str:
    if dialect.capabilities.account_grantees:
        # 'user'@'host', or a role (or 'user', any host): string literals, quotes doubled.
        user, at, host = grantee.rpartition("@") if "@" in grantee else (grantee, "", "")
        quoted = "'" + user.replace("'", "''") + "'"
        return quoted + (f"@'{host.replace(chr(39), chr(39) * 2)}'" if at else "")
    return str(dialect.sqlalchemy_dialect().identifier_preparer.quote(grantee))


def grant_statements(
    dialect: Dialect, table: sa.Table, privileges: Sequence[str], grantee: str, *, serial_id: bool = False
) -> list[str]:
    """The ``GRANT`` statements that give ``grantee`` (a role, or on MySQL/MariaDB an account
    ``user@host``) ``privileges`` on ``table``: with the schema's ``USAGE`` where the database
    needs it, and the id sequence's where ``serial_id`` (an id generated without ``IDENTITY``)
    and rows are inserted. Empty for a database without grants."""
    if not dialect.capabilities.grants or not privileges:
        return []
    preparer = dialect.sqlalchemy_dialect().identifier_preparer
    who = _grantee(dialect, grantee)
    ordered = [p for p in PRIVILEGES if p in privileges] + [p for p in privileges if p not in PRIVILEGES]
    out = []
    if table.schema and dialect.capabilities.schema_usage:
        out.append(f"GRANT USAGE ON SCHEMA {preparer.quote_schema(table.schema)} TO {who}")
    out.append(f"GRANT {', '.join(ordered)} ON {preparer.format_table(table)} TO {who}")
    if serial_id and "INSERT" in ordered and dialect.capabilities.serial_sequences:
        id_column = next(c for c in table.primary_key.columns if c.autoincrement is not False)
        sequence = sa.Sequence(f"{table.name}_{id_column.name}_seq", schema=table.schema)
        out.append(f"GRANT USAGE ON SEQUENCE {preparer.format_sequence(sequence)} TO {who}")
    return out


# ``1 = 0``: every database's false, where ``sa.false()`` renders as a bare ``0`` on Oracle.
_NEVER = sa.literal_column("1") == sa.literal_column("0")


def privilege_probe(table: sa.Table, privilege: str) -> sa.Executable:
    """A statement that needs ``privilege`` on ``table`` and no other, and touches no row
    (``WHERE 1 = 0``): run at start, it finds a missing grant before any work depends on it."""
    if privilege == "SELECT":
        return sa.select(*table.c).where(_NEVER)
    if privilege == "INSERT":
        # Every column but a generated id: MariaDB refuses an INSERT that leaves out a NOT NULL
        # column without a default, even one that inserts no row.
        columns = [c.name for c in table.c if c is not table.autoincrement_column]
        return sa.insert(table).from_select(columns, sa.select(*(sa.null() for _ in columns)).where(_NEVER))
    column = next(c for c in table.c if not c.primary_key)
    if privilege == "UPDATE":
        return sa.update(table).where(_NEVER).values({column.name: sa.null()})
    if privilege == "DELETE":
        return sa.delete(table).where(_NEVER)
    raise ValueError(f"no probe for privilege {privilege!r}; expected one of {', '.join(PRIVILEGES)}")


def is_privilege_error(dialect: Dialect, error: BaseException) -> bool:
    """Whether ``error`` (a SQLAlchemy ``DBAPIError`` or the driver's own) is the database
    refusing a statement for want of a privilege, by the dialect's ``privilege_errors``."""
    codes = dialect.capabilities.privilege_errors
    return bool(codes) and not error_codes(error).isdisjoint(codes)
