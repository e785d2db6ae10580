"""Typed values on the consuming side: each message's value decoded before the handler sees it.

``Inbox(config, handler, value_deserializer=D)`` (any confluent-kafka ``Deserializer``:
``AvroDeserializer``, ``JSONDeserializer``, ``ProtobufDeserializer``) hands the handler messages
whose ``value`` is ``D(value, SerializationContext(topic, VALUE, headers))``. A value that does
not decode raises :class:`UndecodableValueError` inside the handler's call: a poison message,
which the inbox's ``errorPolicy`` treats as any failing handler (``dead-letter`` stores it and
parks its key; ``stop`` stops the inbox with the reason), never a crash of the consumer.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from confluent_kafka.serialization import MessageField, SerializationContext

from pyharvest.core.inbox.message import InboxMessage
from pyharvest.core.inbox.ports import BatchHandler, Handler

__all__ = ["UndecodableValueError", "ValueDeserializer", "decoding_batch_handler", "decoding_handler"]

#: What ``value_deserializer=`` takes: confluent-kafka's ``Deserializer`` shape.
ValueDeserializer = Callable[[bytes | None, SerializationContext], Any]


class UndecodableValueError(ValueError):
    """A message's value did not decode with the inbox's ``value_deserializer``."""


def decoded(message: InboxMessage, deserializer: ValueDeserializer) -> InboxMessage:
    """``message`` with its value decoded (a tombstone stays None)."""
    if message.value is None:
        return message
    ctx = SerializationContext(message.topic, MessageField.VALUE, list(message.headers))
    try:
        value = deserializer(message.value, ctx)
    except Exception as e:  # noqa: BLE001 - any failure to decode makes the message poison
        raise UndecodableValueError(
            f"the value of {message.topic}[{message.partition}]@{message.offset} did not decode with "
            f"{type(deserializer).__name__}: {type(e).__name__}: {e}"
        ) from e
    return dataclasses.replace(message, value=value)


def decoding_handler(handler: Handler, deserializer: ValueDeserializer) -> Handler:
    """``handler``, handed each message with its value decoded."""

    def handle(tx: Any, message: InboxMessage) -> object:
        return handler(tx, decoded(message, deserializer))

    return handle


def decoding_batch_handler(handler: BatchHandler, deserializer: ValueDeserializer) -> BatchHandler:
    """``handler``, handed each transaction's messages with their values decoded."""

    def handle(tx: Any, messages: list[InboxMessage]) -> object:
        return handler(tx, [decoded(m, deserializer) for m in messages])

    return handle
