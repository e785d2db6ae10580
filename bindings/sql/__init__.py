"""The SQL binding: the outbox table through SQLAlchemy Core, one dialect plugin per database.

>>> binding = create_binding("postgresql+psycopg://app@localhost/app", "outbox")  # doctest: +SKIP
"""

from pyharvest.bindings.sql.binding import ID_BATCH, SqlBinding
from pyharvest.bindings.sql.factory import create_binding
from pyharvest.bindings.sql.schema import check_table, create_outbox_table, schema_ddl
from pyharvest.plugins.api import (
    GOHARVEST,
    LAYOUTS,
    NATIVE,
    MalformedRowError,
    OutboxTable,
    TableName,
    libpq_to_url,
    mask_url,
    parse_table_name,
)

__all__ = [
    "GOHARVEST",
    "ID_BATCH",
    "LAYOUTS",
    "NATIVE",
    "MalformedRowError",
    "OutboxTable",
    "SqlBinding",
    "TableName",
    "check_table",
    "create_binding",
    "create_outbox_table",
    "libpq_to_url",
    "mask_url",
    "parse_table_name",
    "schema_ddl",
]
