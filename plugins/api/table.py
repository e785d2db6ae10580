"""The outbox table as SQLAlchemy Core sees it, per layout, with the row codecs.

Two layouts exist:

``native``
    Portable across dialects: ``kafka_value`` is binary, ``kafka_headers`` is JSON text
    (see :mod:`pyharvest.core.outbox.headers`), ``leader_id`` is a 36-character string.
``goharvest``
    goharvest's own PostgreSQL table, unchanged: ``kafka_value`` is text (UTF-8),
    headers are two ``TEXT[]`` columns, ``leader_id`` is a ``UUID``.

Decoding is the per-row hot path of the harvester, so it is a plain function per layout.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Dialect as SADialect
from sqlalchemy.types import TypeDecorator

from pyharvest.core.outbox.headers import EMPTY_HEADERS, decode_headers, encode_headers
from pyharvest.core.outbox.keys import key_hash
from pyharvest.core.outbox.records import InvalidRecordError, OutboxRecord, stored_record
from pyharvest.plugins.api.capabilities import backend_capabilities
from pyharvest.plugins.api.identifiers import TableName

__all__ = [
    "GOHARVEST",
    "KEY_HASH_COLUMN",
    "KEY_HASH_GUARD_SUFFIX",
    "KEY_LENGTH",
    "LAYOUTS",
    "NATIVE",
    "Encoder",
    "GeneratedId",
    "MalformedRowError",
    "OutboxTable",
    "RowFilter",
    "UTCDateTime",
]

NATIVE = "native"
GOHARVEST = "goharvest"
LAYOUTS = (NATIVE, GOHARVEST)

#: The native layout's optional column holding the key's hash (:func:`pyharvest.core.outbox.keys.key_hash`),
#: which places a row in a shard when the outbox is harvested in shards.
KEY_HASH_COLUMN = "kafka_key_hash"
#: The end of the name of the constraint or trigger that makes a sharded table refuse rows
#: without a key hash (``pyharvest_key_hash_guard``); its refusals name it.
KEY_HASH_GUARD_SUFFIX = "_key_hash_required"
TOPIC_LENGTH = 249  # Kafka's limit
KEY_LENGTH = 255  # characters; enough for ids, UUIDs and composite keys
LEADER_ID_LENGTH = 36  # a UUID in text form

# Columns each layout must have; used to check an existing table at start-up.
REQUIRED_COLUMNS: dict[str, tuple[str, ...]] = {
    NATIVE: ("id", "create_time", "kafka_topic", "kafka_key", "kafka_value", "kafka_headers", "leader_id"),
    GOHARVEST: (
        "id",
        "create_time",
        "kafka_topic",
        "kafka_key",
        "kafka_value",
        "kafka_header_keys",
        "kafka_header_values",
        "leader_id",
    ),
}

_UTC = UTC

#: A clause a mark adds to its choice of rows, built on the table or alias it selects from.
RowFilter = Callable[[sa.FromClause], sa.ColumnElement[bool]]
#: A record, the time it is stashed at and its value as checked → the insert's parameters.
Encoder = Callable[[OutboxRecord, datetime, bytes | str | None], dict[str, Any]]


class MalformedRowError(ValueError):
    """A marked row cannot be turned into a record (e.g. header arrays of unequal length)."""

    def __init__(self, row_id: object, problem: str) -> None:
        super().__init__(f"outbox row id={row_id}: {problem}")
        self.row_id = row_id
        self.problem = problem


class UTCDateTime(TypeDecorator[datetime]):
    """Timestamps are aware UTC datetimes in Python whatever the database stores.

    Where the database stores the offset (the dialect's ``aware_timestamps`` capability:
    PostgreSQL's ``timestamptz``) aware datetimes are bound as they are, so a writer's session
    time zone cannot shift them. Elsewhere (SQLite, MySQL ``DATETIME``, Oracle via
    python-oracledb) they are bound as naive UTC, and reading attaches UTC again.
    """

    impl = sa.DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: SADialect) -> datetime | None:
        if value is None or value.tzinfo is None or backend_capabilities(dialect.name).aware_timestamps:
            return value
        return value.astimezone(_UTC).replace(tzinfo=None)

    def process_result_value(self, value: datetime | None, dialect: SADialect) -> datetime | None:
        if value is not None and value.tzinfo is None:
            return value.replace(tzinfo=_UTC)
        return value


class GeneratedId(TypeDecorator[int]):
    """A generated 64-bit id: ``BIGINT``, or ``INTEGER`` where only that counts up by itself
    (the dialect's ``integer_ids`` capability: SQLite)."""

    impl = sa.BigInteger
    cache_ok = True

    def load_dialect_impl(self, dialect: SADialect) -> sa.types.TypeEngine[Any]:
        integer_ids = backend_capabilities(dialect.name).integer_ids
        return dialect.type_descriptor(sa.Integer() if integer_ids else sa.BigInteger())


def _native_columns() -> list[sa.Column[Any]]:
    # The one description of the table: what rows are read and written through, and (with the
    # dialect's types and options, plugins/api/ddl.py) what its CREATE TABLE is compiled from.
    # The server defaults serve rows written by hand; pyharvest's writers set every column.
    return [
        sa.Column("id", sa.BigInteger, primary_key=True, autoincrement=True),
        sa.Column("create_time", UTCDateTime, nullable=False, server_default=sa.text("CURRENT_TIMESTAMP")),
        sa.Column("kafka_topic", sa.String(TOPIC_LENGTH), nullable=False),
        sa.Column("kafka_key", sa.Unicode(KEY_LENGTH), nullable=False),
        sa.Column("kafka_value", sa.LargeBinary, nullable=True),
        sa.Column("kafka_headers", sa.Text, nullable=False, server_default=EMPTY_HEADERS),
        sa.Column("leader_id", sa.String(LEADER_ID_LENGTH), nullable=True),
    ]


def _goharvest_columns() -> list[sa.Column[Any]]:
    return [
        sa.Column("id", sa.BigInteger, primary_key=True, autoincrement=True),
        sa.Column("create_time", UTCDateTime, nullable=False),
        sa.Column("kafka_topic", sa.String(TOPIC_LENGTH), nullable=False),
        sa.Column("kafka_key", sa.String(100), nullable=False),
        sa.Column("kafka_value", sa.String(10000), nullable=True),
        sa.Column("kafka_header_keys", sa.ARRAY(sa.Text), nullable=False),
        sa.Column("kafka_header_values", sa.ARRAY(sa.Text), nullable=False),
        sa.Column("leader_id", sa.Uuid(as_uuid=False), nullable=True),
    ]


def _decode_native(row: Sequence[Any]) -> OutboxRecord:
    id_, create_time, topic, key, value, headers, leader_id = row
    if type(value) is memoryview:
        value = bytes(value)
    try:
        decoded = () if headers == "[]" else decode_headers(headers)
    except (ValueError, TypeError) as e:
        raise MalformedRowError(id_, f"kafka_headers is not valid header JSON: {e}") from None
    return stored_record(topic, key, value, decoded, id_, create_time, leader_id)


def _encode_native(record: OutboxRecord, now: datetime, value: bytes | str | None) -> dict[str, Any]:
    return {
        "create_time": now,
        "kafka_topic": record.topic,
        "kafka_key": record.key,
        "kafka_value": value.encode() if isinstance(value, str) else value,  # ASCII, else check_record encoded it
        "kafka_headers": encode_headers(record.headers),
    }


def _decode_goharvest(row: Sequence[Any]) -> OutboxRecord:
    id_, create_time, topic, key, value, header_keys, header_values, leader_id = row
    if len(header_keys) != len(header_values):
        raise MalformedRowError(
            id_,
            f"kafka_header_keys has {len(header_keys)} entries but kafka_header_values has "
            f"{len(header_values)}; fix or delete the row",
        )
    headers = tuple(zip(header_keys, header_values, strict=True)) if header_keys else ()
    return stored_record(
        topic, key, None if value is None else value.encode(), headers, id_, create_time, leader_id
    )


def _text(what: str, value: str | bytes) -> str:
    """goharvest stores text: bytes must be UTF-8, and PostgreSQL text cannot hold NUL."""
    if isinstance(value, bytes):
        try:
            value = value.decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidRecordError(
                f"{what} is not UTF-8: the goharvest table layout stores text; use the native layout for binary data"
            ) from None
    if "\x00" in value:
        raise InvalidRecordError(f"{what} contains a NUL character, which PostgreSQL text cannot store")
    return value


def _encode_goharvest(record: OutboxRecord, now: datetime, _value: bytes | str | None) -> dict[str, Any]:
    value = record.value  # stored as text: the record's own, not its UTF-8
    return {
        "create_time": now,
        "kafka_topic": record.topic,
        "kafka_key": _text("record key", record.key),
        "kafka_value": None if value is None else _text("record value", value),
        "kafka_header_keys": [_text("header key", k) for k, _ in record.headers],
        "kafka_header_values": [_text(f"header {k!r} value", v) for k, v in record.headers],
    }


def _with_key_hash(encode: Encoder) -> Encoder:
    def encode_with_hash(record: OutboxRecord, now: datetime, value: bytes | str | None) -> dict[str, Any]:
        row = encode(record, now, value)
        row[KEY_HASH_COLUMN] = key_hash(record.key)
        return row

    return encode_with_hash


# A layout's (columns, decode a row, encode a record).
_Codec = tuple[Callable[[], list[sa.Column[Any]]], Callable[..., OutboxRecord], Encoder]
_CODECS: dict[str, _Codec] = {
    NATIVE: (_native_columns, _decode_native, _encode_native),
    GOHARVEST: (_goharvest_columns, _decode_goharvest, _encode_goharvest),
}


@dataclass(frozen=True, eq=False)
class OutboxTable:
    """One outbox table: its name, layout, Core :class:`~sqlalchemy.Table` and row codecs.

    ``table.c`` holds the columns in the order rows are selected and decoded.
    """

    name: TableName
    layout: str
    table: sa.Table
    decode: Callable[[Sequence[Any]], OutboxRecord] = field(repr=False)
    #: A checked record's insert parameters: ``encode(record, now, value)``, ``value`` being
    #: the record's as :func:`~pyharvest.core.outbox.records.check_record` returned it (a str
    #: that is not ASCII already in UTF-8), so that a stash encodes a value once.
    encode: Encoder = field(repr=False)
    #: Clauses every mark adds to its row choice, each given the table (or the alias) the mark
    #: selects from: the quarantine's ``NOT EXISTS`` with ``poisonPolicy: quarantine``, the
    #: shard's key filter when the outbox is harvested in shards.
    filters: tuple[RowFilter, ...] = field(default=(), repr=False)
    #: The table has the :data:`KEY_HASH_COLUMN`, which the stasher fills in.
    key_hash: bool = False

    @classmethod
    def build(cls, name: TableName, layout: str = NATIVE, *, key_hash: bool = False) -> OutboxTable:
        if layout not in _CODECS:
            raise ValueError(f"unknown outbox table layout {layout!r}; expected one of {', '.join(LAYOUTS)}")
        columns, decode, encode = _CODECS[layout]
        extra: list[sa.Column[Any]] = []
        if key_hash:
            if layout != NATIVE:
                raise ValueError(f"the {layout!r} layout has no {KEY_HASH_COLUMN} column")
            extra.append(sa.Column(KEY_HASH_COLUMN, sa.Integer, nullable=True))
            encode = _with_key_hash(encode)
        table = sa.Table(name.name, sa.MetaData(), *columns(), *extra, schema=name.schema)
        return cls(name, layout, table, decode, encode, key_hash=key_hash)

    @property
    def columns(self) -> list[sa.Column[Any]]:
        """The columns a mark returns, in the order rows are decoded."""
        return [c for c in self.table.c if c.name != KEY_HASH_COLUMN]

    @property
    def stashed_columns(self) -> tuple[str, ...]:
        """The columns a stash writes, in table order: every one but ``id`` (generated) and
        ``leader_id`` (NULL until marked). They are the keys of :attr:`encode`'s result."""
        return tuple(c.name for c in self.table.c if c.name not in ("id", "leader_id"))

    @property
    def id(self) -> sa.Column[Any]:
        return self.table.c.id

    @property
    def leader_id(self) -> sa.Column[Any]:
        return self.table.c.leader_id

    def unmarked_by(
        self, leader_param: sa.BindParameter[Any], source: sa.FromClause | None = None
    ) -> sa.ColumnElement[bool]:
        """Rows of ``source`` (the table, or an alias of it) a mark may take: never marked or
        marked by another leader, and passing every filter (not of a quarantined key…)."""
        source = self.table if source is None else source
        leader_id = source.c.leader_id
        unmarked = sa.or_(leader_id.is_(None), leader_id != leader_param)
        if not self.filters:
            return unmarked
        return sa.and_(unmarked, *(f(source) for f in self.filters))

    def where(self, row_filter: RowFilter) -> OutboxTable:
        """This table, with marks restricted to the rows ``row_filter`` accepts."""
        return dataclasses.replace(self, filters=(*self.filters, row_filter))

    @staticmethod
    def now() -> datetime:
        return datetime.now(_UTC)
