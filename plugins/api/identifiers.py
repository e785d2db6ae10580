"""Table names from configuration: validated, never spliced into SQL unquoted.

A name is ``table`` or ``schema.table``; each part a plain identifier (letters, digits,
``_``, ``$``; not starting with a digit). Anything else is refused, so configuration
cannot smuggle SQL. Quoting follows SQLAlchemy's convention: an all-lower-case name is
case-insensitive (quoted only when it is a reserved word, such as ``order``); a name with
upper-case letters is quoted and so case-sensitive.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from sqlalchemy.sql.compiler import IdentifierPreparer

from pyharvest.core.errors import ConfigError

__all__ = ["TableName", "parse_table_name"]

FIELD = "outboxTable"
_PART = re.compile(r"[A-Za-z_][A-Za-z0-9_$]*")
# The shortest limit among supported databases (PostgreSQL's 63 bytes; Oracle allows 128).
MAX_PART_LENGTH = 63


@dataclass(frozen=True, slots=True)
class TableName:
    name: str
    schema: str | None = None

    def __str__(self) -> str:
        return f"{self.schema}.{self.name}" if self.schema else self.name

    def quoted(self, preparer: IdentifierPreparer) -> str:
        q = preparer.quote(self.name)
        return f"{preparer.quote_schema(self.schema)}.{q}" if self.schema else q


def parse_table_name(value: object) -> TableName:
    """Validate an ``outboxTable`` value; raise :class:`ConfigError` naming the field."""
    if isinstance(value, TableName):
        return value
    if not isinstance(value, str) or not value:
        raise ConfigError(FIELD, f"expected a table name such as 'outbox' or 'app.outbox', got {value!r}")
    parts = value.split(".")
    if len(parts) > 2 or not all(_PART.fullmatch(p) for p in parts):
        raise ConfigError(
            FIELD,
            f"{value!r} is not a valid table name: use 'table' or 'schema.table', each part "
            "letters, digits, '_' or '$', not starting with a digit",
        )
    for p in parts:
        if len(p) > MAX_PART_LENGTH:
            raise ConfigError(FIELD, f"{p!r} is longer than {MAX_PART_LENGTH} characters")
    return TableName(parts[-1], parts[0] if len(parts) == 2 else None)
