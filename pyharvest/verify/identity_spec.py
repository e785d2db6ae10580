"""What identifies a record, read alike from a Kafka message and from a stashed record.

Guarantee: an :class:`~pyharvest.core.outbox.records.OutboxRecord` and the message the harvester
published from it yield equal identities under the same spec (``"value"`` or
``"header:NAME"``, as bytes), so that :func:`~pyharvest.verify.verify_topic` never reports
a loss that is only ``str`` compared with ``bytes``. A spec that cannot be read is refused
with :class:`VerifyError` before anything is read.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable
from typing import Any

from pyharvest.core.outbox.records import OutboxRecord

__all__ = [
    "Identity",
    "IdentitySpec",
    "Key",
    "VerifyError",
    "expected_from_records",
    "expected_pair",
    "parse_identity",
    "record_identity",
]

Key = Hashable
Identity = Hashable
#: How a message is identified: ``"value"`` (the value bytes), ``"header:NAME"`` (the bytes
#: of header NAME; ``None`` if absent), or a function of a confluent-kafka ``Message``.
IdentitySpec = str | Callable[[Any], Identity]


class VerifyError(RuntimeError):
    """The check could not be run (bad identity spec, topic missing, broker unreachable)."""


def parse_identity(spec: IdentitySpec) -> Callable[[Any], Identity]:
    """Turn ``"value"``, ``"header:NAME"`` or a callable into a function of a Kafka message.

    Identities read from Kafka are bytes (or ``None``: a tombstone, a missing header).
    """
    if callable(spec):
        return spec
    if spec == "value":
        return lambda m: m.value()
    if isinstance(spec, str) and spec.startswith("header:") and len(spec) > len("header:"):
        name = spec[len("header:"):]

        def header(m: Any) -> Identity:
            for k, v in m.headers() or ():
                if k == name:
                    return v  # type: ignore[no-any-return]
            return None

        return header
    raise VerifyError(f"identity must be 'value' or 'header:NAME', got {spec!r}")


def record_identity(record: OutboxRecord, spec: str) -> Identity:
    if spec == "value":
        return record.value_bytes()
    if spec.startswith("header:"):
        name = spec[len("header:"):]
        for k, v in record.headers:
            if k == name:
                return v.encode() if isinstance(v, str) else v
        return None
    raise VerifyError(f"identity of an OutboxRecord must be 'value' or 'header:NAME', got {spec!r}")


def expected_from_records(records: Iterable[OutboxRecord], identity: str = "value") -> list[tuple[Key, Identity]]:
    """(key, identity) pairs for records in the order they were stashed; identities are
    bytes, the way :func:`verify_topic` reads them from Kafka."""
    return [(r.key, record_identity(r, identity)) for r in records]


def _as_bytes(x: Identity) -> Identity:
    return x.encode() if isinstance(x, str) else x


def expected_pair(item: tuple[Key, Identity] | OutboxRecord, identity: IdentitySpec) -> tuple[Key, Identity]:
    if isinstance(item, OutboxRecord):
        if not isinstance(identity, str):
            raise VerifyError("with an identity function, give expected (key, identity) pairs, not OutboxRecords")
        return item.key, record_identity(item, identity)
    key, ident = item
    return key, _as_bytes(ident) if isinstance(identity, str) else ident
