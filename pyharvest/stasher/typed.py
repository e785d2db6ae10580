"""Typed values: a record's value serialised at stash time, in the caller's transaction.

A :class:`~pyharvest.stasher.stashers.Stasher` given ``value_serializer=`` (any confluent-kafka
``Serializer``: ``AvroSerializer``, ``JSONSerializer``, ``ProtobufSerializer``, or a callable of
the same shape) serialises each record's value with its topic's ``SerializationContext`` and
stores the framed bytes, schema id and all. The harvester publishes those bytes unchanged, so
it never needs the registry: a registry outage never stops publishing, and every stored row
says which schema wrote it (a backlog written across a schema change decodes row by row).

What the serialiser refuses is refused here, before anything is written, with the reason a
person can act on: :class:`SchemaMismatchError` (the value does not match its schema, with the
field's path where the schema can tell) or :class:`SchemaRegistryError` (the registry refused
the schema, say as incompatible, or could not be reached for a schema not yet cached).

``cloud_events=`` adds the CloudEvents Kafka protocol binding's binary-mode headers
(:class:`CloudEvents`).
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, Protocol

from confluent_kafka.serialization import MessageField, SerializationContext

from pyharvest.core.outbox.records import Header, InvalidRecordError, OutboxRecord

__all__ = [
    "DEFAULT_REGISTRY_TIMEOUT",
    "CloudEvents",
    "SchemaMismatchError",
    "SchemaRegistryError",
    "Typing",
    "ValueSerializer",
    "registry_client",
]

#: Seconds a schema registry call may take before the stash fails (confluent-kafka's own
#: default is none: a registry that accepts a connection and never answers would hang the
#: caller's transaction for good).
DEFAULT_REGISTRY_TIMEOUT = 5.0


def registry_client(url: str, *, timeout: float = DEFAULT_REGISTRY_TIMEOUT, **conf: Any) -> Any:
    """A confluent-kafka ``SchemaRegistryClient`` for ``url`` whose calls time out after
    ``timeout`` seconds; ``conf`` adds the client's other settings (``basic.auth.user.info``,
    ``ssl.ca.location``, ...)."""
    try:
        from confluent_kafka.schema_registry import SchemaRegistryClient
    except ImportError as e:
        raise ImportError(
            f"the schema registry client needs confluent-kafka's registry extras ({e}): "
            "pip install 'pyharvest[schema-registry]'"
        ) from None
    return SchemaRegistryClient({"url": url, "timeout": timeout, **conf})


class ValueSerializer(Protocol):
    """What ``value_serializer=`` takes: confluent-kafka's ``Serializer`` shape."""

    def __call__(self, obj: Any, ctx: SerializationContext | None = None) -> bytes | None: ...


class SchemaMismatchError(InvalidRecordError):
    """The record's value does not match its schema; nothing was written."""


class SchemaRegistryError(RuntimeError):
    """The schema registry refused the value's schema (incompatible with the subject's earlier
    versions, or not registered while auto-registration is off) or could not be reached for a
    schema the serialiser had not cached; nothing was written. The business transaction decides
    what to do: roll back, or retry."""


#: The ``content-type`` a CloudEvent's value gets from its serialiser, by the serialiser's class.
_CONTENT_TYPES = {
    "AvroSerializer": "application/avro",
    "JSONSerializer": "application/json",
    "ProtobufSerializer": "application/protobuf",
}


@dataclasses.dataclass(frozen=True, slots=True)
class CloudEvents:
    """The CloudEvents Kafka protocol binding, binary mode: each record gets ``ce_specversion``,
    a ``ce_id`` of its own, ``ce_source``, ``ce_type`` (fixed, or from the record), ``ce_time``
    (the stash's time, RFC 3339) and ``content-type``. Headers a record already carries win, so
    one record may name its own ``ce_type`` (or ``ce_id``) among its headers."""

    source: str
    #: The event type, or a function of the record (e.g. from its topic).
    type: str | Callable[[OutboxRecord], str]
    #: The value's media type; by default the serialiser's (``application/avro``, ...), else
    #: ``application/octet-stream``.
    content_type: str | None = None

    def headers(self, record: OutboxRecord, content_type: str, now: datetime) -> list[Header]:
        event_type = self.type if isinstance(self.type, str) else self.type(record)
        given = {k for k, _ in record.headers}
        added: list[Header] = [
            ("ce_specversion", "1.0"),
            ("ce_id", str(uuid.uuid4())),
            ("ce_source", self.source),
            ("ce_type", event_type),
            ("ce_time", now.isoformat().replace("+00:00", "Z")),
            ("content-type", self.content_type or content_type),
        ]
        return [*record.headers, *(h for h in added if h[0] not in given)]


class Typing:
    """How one stasher turns a record's value into what is stored: serialised (and framed) by
    ``value_serializer``, and CloudEvents headers added; once per record, before it is checked."""

    __slots__ = ("_cloud_events", "_content_type", "_serializer")

    def __init__(self, value_serializer: ValueSerializer | None, cloud_events: CloudEvents | None) -> None:
        if value_serializer is not None and not callable(value_serializer):
            raise TypeError(
                f"value_serializer must be a confluent-kafka Serializer (callable as serializer(value, ctx)), "
                f"got {type(value_serializer).__name__}"
            )
        if cloud_events is not None and not isinstance(cloud_events, CloudEvents):
            raise TypeError(f"cloud_events must be a CloudEvents, got {type(cloud_events).__name__}")
        _check_timeout(value_serializer)
        self._serializer = value_serializer
        self._cloud_events = cloud_events
        self._content_type = (
            _CONTENT_TYPES.get(type(value_serializer).__name__, "application/octet-stream")
            if value_serializer is not None
            else "application/octet-stream"
        )

    def apply(self, record: OutboxRecord) -> OutboxRecord:
        """The record as it is to be stored: its value serialised, its headers completed."""
        if not isinstance(record, OutboxRecord):
            return record  # the validation that follows says what is wrong
        value, headers = record.value, record.headers
        if self._serializer is not None and value is not None:
            # The serialiser may add headers (a schema id carried in a header): give it a copy,
            # and keep it only if it did.
            ctx_headers = list(headers)
            value = self._serialize(record, ctx_headers)
            if len(ctx_headers) != len(headers):
                headers = ctx_headers
        if value is record.value and headers is record.headers and self._cloud_events is None:
            return record
        # Built directly: dataclasses.replace() reads the fields anew per call, a third of this
        # method's cost per record.
        typed = OutboxRecord(record.topic, record.key, value, headers, record.id, record.create_time, record.leader_id)
        if self._cloud_events is not None:
            typed.headers = self._cloud_events.headers(typed, self._content_type, datetime.now(UTC))
        return typed

    def _serialize(self, record: OutboxRecord, headers: list[Header]) -> bytes | None:
        serializer = self._serializer
        assert serializer is not None
        # The context's list is the serialiser's to append to (confluent-kafka types it with
        # optional values; ours are never None).
        ctx = SerializationContext(record.topic, MessageField.VALUE, headers)  # type: ignore[arg-type]
        try:
            return serializer(record.value, ctx)
        except Exception as e:  # noqa: BLE001 - translated into one of two errors a caller can act on
            raise _translated(e, record, serializer) from e


def _check_timeout(serializer: object) -> None:
    """Refuse a serialiser whose registry client waits for ever: a stash runs inside the
    caller's transaction, which a registry that never answers would hold open."""
    client = getattr(serializer, "_registry", None)
    rest = getattr(client, "_rest_client", None)
    if rest is not None and getattr(rest, "timeout", 0) is None:
        raise ValueError(
            f"value_serializer's SchemaRegistryClient at {_registry_url(serializer)} has no timeout, so a registry "
            "that does not answer would hang the stash and its transaction: create the client with "
            f"{{'url': ..., 'timeout': {DEFAULT_REGISTRY_TIMEOUT:g}}}, or with pyharvest.stasher.registry_client(url)"
        )


def _translated(error: Exception, record: OutboxRecord, serializer: object) -> Exception:
    """What a serialiser's failure means to the caller: the value, or the registry."""
    registry = _registry_failure(error, serializer)
    if registry is not None:
        return SchemaRegistryError(registry)
    detail = _schema_path(error, record, serializer) or f"{type(error).__name__}: {error}"
    return SchemaMismatchError(
        f"record value for topic {record.topic!r} (key {record.key!r}) does not match its schema: {detail}"
    )


def _registry_url(serializer: object) -> str:
    # The serialisers keep their client as ``_registry`` and it keeps its URLs in its REST
    # client: read only for messages, so that a change there costs a vaguer message, no more.
    client = getattr(serializer, "_registry", None)
    conf = getattr(client, "_rest_client", None)
    urls = getattr(conf, "base_urls", None)
    if urls:
        return ", ".join(str(u) for u in urls)
    return "the schema registry"


def _registry_failure(error: Exception, serializer: object) -> str | None:
    """A message naming the registry when ``error`` came from it (refused, or unreachable)."""
    try:  # the registry's client comes with the schema-registry extra; a serialiser of its own may not need it
        from confluent_kafka.schema_registry.error import SchemaRegistryError as RegistryRefused
    except ImportError:
        RegistryRefused = ()  # type: ignore[assignment,misc]  # noqa: N806 - nothing is an instance of no class

    url = _registry_url(serializer)
    if isinstance(error, RegistryRefused):
        status = getattr(error, "http_status_code", None)
        why = getattr(error, "error_message", str(error))
        if status == 409:
            return (
                f"the schema registry at {url} refused the schema as incompatible with the subject's earlier "
                f"versions (HTTP 409: {why}); evolve the schema compatibly (e.g. give a new field a default), "
                "or change the subject's compatibility level"
            )
        return f"the schema registry at {url} refused the request (HTTP {status}: {why})"
    names = {cls.__name__ for cls in type(error).__mro__}
    modules = {cls.__module__.split(".")[0] for cls in type(error).__mro__}
    if names & {"ConnectError", "TimeoutException", "ConnectionError", "Timeout", "NetworkError"} or (
        modules & {"httpx", "httpcore", "requests", "urllib3"}
    ):
        return (
            f"the schema registry at {url} could not be reached ({type(error).__name__}: {error}) for a schema "
            "this process has not cached yet; nothing was written. Records whose schema is cached still stash"
        )
    return None


def _schema_path(error: Exception, record: OutboxRecord, serializer: object) -> str | None:
    """The field a bad value fails at, where the schema can tell: JSON Schema's path, or
    fastavro's validation of the value against the parsed Avro schema."""
    cause: BaseException | None = error
    while cause is not None:
        path = getattr(cause, "json_path", None)
        if isinstance(path, str) and hasattr(cause, "message"):
            return f"at {path}: {cause.message}"  # jsonschema's ValidationError
        cause = cause.__cause__ or cause.__context__
    parsed = getattr(serializer, "_parsed_schema", None)
    if parsed is None:
        return None
    try:
        from fastavro.validation import validate
    except ImportError:
        return None
    try:
        validate(_to_dict(serializer, record), parsed, raise_errors=True)
    except Exception as e:  # noqa: BLE001 - fastavro's ValidationError names the field's path
        errors = getattr(e, "errors", None)
        return "; ".join(str(x) for x in errors) if errors else str(e).strip().replace("\n", " ")
    return None


def _to_dict(serializer: object, record: OutboxRecord) -> Any:
    to_dict = getattr(serializer, "_to_dict", None)
    if to_dict is None:
        return record.value
    return to_dict(record.value, SerializationContext(record.topic, MessageField.VALUE))
