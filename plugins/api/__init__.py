"""The dialect plugin API: everything a dialect plugin builds on, in one import.

>>> from pyharvest.plugins.api import hookimpl, MarkQuery, ReturningMark, OutboxTable

A plugin is a plain module of :data:`hookimpl` functions (the hooks are specified and
documented in :mod:`pyharvest.plugins.hookspecs`). It imports this module and SQLAlchemy,
nothing else of pyharvest: the bindings import it too, and neither side imports the other.
What is here:

* the outbox table: :class:`OutboxTable` (name, layout, Core table, row codecs, row filters),
  :class:`TableName`, the layouts and column sizes;
* the mark: :class:`MarkQuery`, the one builder of the row choice every dialect's mark uses,
  and the strategies built on it (:class:`ReturningMark`, :class:`ReturningIdsMark`,
  :class:`TransactionalMark`);
* bulk writes: the :class:`BulkWriter` protocol and its helpers;
* push wake-ups: the :class:`Listener` protocol (PostgreSQL's ``LISTEN``);
* :class:`DialectOptions`: what a dialect declares as data (the answer of its one required
  hook): its name, its :class:`Capabilities` (the flags asked instead of its name, its
  privileges' among them), its tables' :class:`TableOptions`, its :class:`MarkOptions`, its
  ``MERGE``'s :class:`MergeForm`;
* privileges: :func:`grant_statements`, :func:`privilege_probe`, :func:`is_privilege_error`;
* a shared database: the clean-up horizon, :class:`CleanupHorizon`; locks other sessions
  hold, :class:`LockHolder`, :func:`is_lock_timeout`;
* :class:`Dialect`, :func:`load_dialect`: a loaded plugin with typed access to its hooks.
"""

from pyharvest.core.outbox.headers import EMPTY_HEADERS, decode_headers, encode_headers
from pyharvest.plugins.api.bulk import BulkWriter, begin_if_needed, raise_as_sqlalchemy_error
from pyharvest.plugins.api.capabilities import Capabilities
from pyharvest.plugins.api.ddl import TableOptions, create_table_ddl
from pyharvest.plugins.api.dialect import (
    ENTRY_POINT_GROUP,
    Dialect,
    dialect_for_backend,
    dialect_of,
    installed_dialects,
    load_dialect,
)
from pyharvest.plugins.api.grants import PRIVILEGES, grant_statements, is_privilege_error, privilege_probe
from pyharvest.plugins.api.horizon import CleanupHorizon
from pyharvest.plugins.api.identifiers import MAX_PART_LENGTH, TableName, parse_table_name
from pyharvest.plugins.api.locks import LockHolder, is_lock_timeout
from pyharvest.plugins.api.marking import (
    MarkOptions,
    MarkQuery,
    MarkStrategy,
    ReturningIdsMark,
    ReturningMark,
    TransactionalMark,
    literal_limit,
)
from pyharvest.plugins.api.notify import Listener, ListenerFactory
from pyharvest.plugins.api.options import DialectOptions
from pyharvest.plugins.api.shards import SHARD_EXPRESSION, expression_index_ddl, shard_column, shard_column_filter
from pyharvest.plugins.api.table import (
    GOHARVEST,
    KEY_HASH_COLUMN,
    KEY_HASH_GUARD_SUFFIX,
    KEY_LENGTH,
    LAYOUTS,
    NATIVE,
    REQUIRED_COLUMNS,
    TOPIC_LENGTH,
    GeneratedId,
    MalformedRowError,
    OutboxTable,
    RowFilter,
    UTCDateTime,
)
from pyharvest.plugins.api.upsert import MergeForm, UpsertFromSelect, compile_merge
from pyharvest.plugins.api.urls import LIBPQ_DIALECT, is_libpq_dsn, libpq_to_url, mask_url
from pyharvest.plugins.hookspecs import PROJECT_NAME, hookimpl

__all__ = [
    "EMPTY_HEADERS",
    "ENTRY_POINT_GROUP",
    "GOHARVEST",
    "KEY_HASH_COLUMN",
    "KEY_HASH_GUARD_SUFFIX",
    "KEY_LENGTH",
    "LAYOUTS",
    "LIBPQ_DIALECT",
    "MAX_PART_LENGTH",
    "NATIVE",
    "PRIVILEGES",
    "PROJECT_NAME",
    "REQUIRED_COLUMNS",
    "SHARD_EXPRESSION",
    "TOPIC_LENGTH",
    "BulkWriter",
    "Capabilities",
    "CleanupHorizon",
    "Dialect",
    "DialectOptions",
    "GeneratedId",
    "Listener",
    "ListenerFactory",
    "LockHolder",
    "MalformedRowError",
    "MarkOptions",
    "MarkQuery",
    "MarkStrategy",
    "MergeForm",
    "OutboxTable",
    "ReturningIdsMark",
    "ReturningMark",
    "RowFilter",
    "TableName",
    "TableOptions",
    "TransactionalMark",
    "UTCDateTime",
    "UpsertFromSelect",
    "begin_if_needed",
    "compile_merge",
    "create_table_ddl",
    "decode_headers",
    "dialect_for_backend",
    "dialect_of",
    "encode_headers",
    "expression_index_ddl",
    "grant_statements",
    "hookimpl",
    "installed_dialects",
    "is_libpq_dsn",
    "is_lock_timeout",
    "is_privilege_error",
    "libpq_to_url",
    "literal_limit",
    "load_dialect",
    "mask_url",
    "parse_table_name",
    "privilege_probe",
    "raise_as_sqlalchemy_error",
    "shard_column",
    "shard_column_filter",
]
