"""The options of ``df.write.format("pyharvest.outbox")``, checked on the driver before any task runs."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql.types import ArrayType, BinaryType, DataType, MapType, StringType, StructType

from pyharvest.bindings.spark.arrow_rows import EventFunction, EventMapping, OutboxColumns
from pyharvest.core.errors import ConfigError
from pyharvest.core.outbox.records import InvalidRecordError, OutboxRecord, validate_record
from pyharvest.plugins.api import TableName, parse_table_name

__all__ = ["WriterOptions", "parse_writer_options"]

KNOWN_OPTIONS = frozenset(
    {
        "url", "table", "binding", "target_table", "target_key_columns", "events",
        "event_topic", "event_key_column", "event_value_column",
    }
)


@dataclass(frozen=True)
class WriterOptions:
    url: str = field(repr=False)  # may hold a password: never in a repr or a log line
    binding: str | None
    outbox: TableName
    columns: list[str]
    # Records mode: the DataFrame is the records.
    record_columns: OutboxColumns | None = None
    # Rows mode: the DataFrame's rows go into a target table, events derive from them.
    target: TableName | None = None
    key_columns: tuple[str, ...] = ()
    events: EventMapping | EventFunction | None = field(default=None, repr=False)


def _text_or_binary(t: DataType) -> bool:
    return isinstance(t, StringType | BinaryType)


def _check_headers_type(t: DataType) -> None:
    ok = False
    if isinstance(t, MapType):
        ok = isinstance(t.keyType, StringType) and _text_or_binary(t.valueType)
    elif isinstance(t, ArrayType) and isinstance(t.elementType, StructType):
        names = {f.name: f.dataType for f in t.elementType.fields}
        ok = set(names) == {"key", "value"} and isinstance(names["key"], StringType) and _text_or_binary(names["value"])
    if not ok:
        raise ConfigError(
            "headers",
            f"column 'headers' must be map<string, string|binary> or array<struct<key: string, value: string|binary>>, "
            f"got {t.simpleString()}",
        )


def parse_writer_options(options: Mapping[str, str], schema: StructType,
                         event_functions: Mapping[str, EventFunction]) -> WriterOptions:
    unknown = sorted(set(options) - KNOWN_OPTIONS)
    if unknown:
        raise ConfigError(
            "options", f"unknown option(s) {', '.join(unknown)}; known: {', '.join(sorted(KNOWN_OPTIONS))}"
        )
    url = options.get("url")
    if not url:
        raise ConfigError("url", "required: the database's SQLAlchemy URL, e.g. postgresql+psycopg://app@db/app")
    outbox = parse_table_name(options.get("table") or "outbox")
    binding = options.get("binding") or None
    types = {f.name: f.dataType for f in schema.fields}
    names = list(types)
    target_opt = options.get("target_table")
    if not target_opt:
        target_only = ("target_key_columns", "events", "event_topic", "event_key_column", "event_value_column")
        extra = [o for o in target_only if o in options]
        if extra:
            raise ConfigError(extra[0], "only applies together with target_table")
        missing = [c for c in ("topic", "key", "value") if c not in types]
        if missing:
            raise ConfigError(
                "columns",
                f"the DataFrame lacks column(s) {', '.join(missing)}; an outbox write needs topic (string), "
                f"key (string), value (binary or string, nullable) and optionally headers; it has: {', '.join(names)}",
            )
        unexpected = [c for c in names if c not in ("topic", "key", "value", "headers")]
        if unexpected:
            raise ConfigError(
                "columns", f"unexpected column(s) {', '.join(unexpected)}; select topic, key, value[, headers]"
            )
        for c in ("topic", "key"):
            if not isinstance(types[c], StringType):
                raise ConfigError(c, f"column {c!r} must be a string, got {types[c].simpleString()}")
        if not _text_or_binary(types["value"]):
            raise ConfigError("value", f"column 'value' must be binary or string, got {types['value'].simpleString()}")
        if "headers" in types:
            _check_headers_type(types["headers"])
        cols = OutboxColumns(headers="headers" if "headers" in types else None)
        return WriterOptions(url, binding, outbox, names, record_columns=cols)

    target = parse_table_name(target_opt)
    keys = tuple(k.strip() for k in (options.get("target_key_columns") or "").split(",") if k.strip())
    missing_keys = [k for k in keys if k not in types]
    if missing_keys:
        raise ConfigError(
            "target_key_columns", f"not DataFrame column(s): {', '.join(missing_keys)}; it has: {', '.join(names)}"
        )
    events: EventMapping | EventFunction | None = None
    fn_name = options.get("events")
    if fn_name and "event_topic" in options:
        raise ConfigError(
            "events", "give either events (a registered function) or event_topic (a column mapping), not both"
        )
    if fn_name:
        if fn_name not in event_functions:
            raise ConfigError(
                "events",
                f"no events function registered as {fn_name!r}; register it with "
                f"pyharvest.bindings.spark.register(spark, events={{{fn_name!r}: fn}}) "
                f"(registered: {', '.join(sorted(event_functions)) or 'none'})",
            )
        events = event_functions[fn_name]
    elif "event_topic" in options:
        topic = options["event_topic"]
        try:
            validate_record(OutboxRecord(topic, "k"))
        except InvalidRecordError as e:
            raise ConfigError("event_topic", str(e)) from None
        key_col = options.get("event_key_column") or (keys[0] if len(keys) == 1 else "")
        if not key_col:
            raise ConfigError("event_key_column", "required unless target_key_columns names exactly one column")
        value_col = options.get("event_value_column") or None
        for opt, col in (("event_key_column", key_col), ("event_value_column", value_col)):
            if col is not None and col not in types:
                raise ConfigError(opt, f"{col!r} is not a DataFrame column; it has: {', '.join(names)}")
        if value_col is not None and not _text_or_binary(types[value_col]):
            raise ConfigError("event_value_column", f"column {value_col!r} must be binary or string")
        events = EventMapping(topic, key_col, value_col)
    return WriterOptions(url, binding, outbox, names, target=target, key_columns=keys, events=events)


def describe(options: WriterOptions) -> dict[str, Any]:
    """For log lines: everything but the URL's secrets."""
    from pyharvest.plugins.api import mask_url

    return {
        "url": mask_url(options.url),
        "table": str(options.outbox),
        "target": str(options.target) if options.target else None,
    }
