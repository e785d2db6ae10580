"""The exceptions pyharvest raises that an application may catch. Every message says what was
wrong and what to do about it.

* :class:`HarvestError` is the base of pyharvest's own: :class:`ConfigError` (a setting,
  named in the message), :class:`BindingError` (the database: :class:`TableNotFoundError`,
  :class:`TableLockedError`, :class:`MissingGrantError`), :class:`TopicError` (Kafka: :class:`KafkaPropertyError`,
  :class:`KafkaAuthorizationError`), :class:`InboxError` (the inbox: :class:`HandlerError`).
* A record the stasher refuses before writing anything: :class:`InvalidRecordError` (a
  ``ValueError``), :class:`KeyTooLongError` and :class:`RecordTooLargeError`; a table it
  cannot write: :class:`OutboxTableMissingError`, :class:`OutboxTableChangedError`.
"""

from pyharvest._public import publish
from pyharvest.core.errors import (
    BindingError,
    ConfigError,
    HarvestError,
    KafkaAuthorizationError,
    KafkaPropertyError,
    MissingGrantError,
    TableLockedError,
    TableNotFoundError,
    TopicError,
)
from pyharvest.core.inbox.errors import HandlerError, InboxError
from pyharvest.core.outbox.records import InvalidRecordError
from pyharvest.stasher.errors import (
    KeyTooLongError,
    OutboxTableChangedError,
    OutboxTableMissingError,
    RecordTooLargeError,
)

__all__ = [
    "BindingError",
    "ConfigError",
    "HandlerError",
    "HarvestError",
    "InboxError",
    "InvalidRecordError",
    "KafkaAuthorizationError",
    "KafkaPropertyError",
    "KeyTooLongError",
    "MissingGrantError",
    "OutboxTableChangedError",
    "OutboxTableMissingError",
    "RecordTooLargeError",
    "TableLockedError",
    "TableNotFoundError",
    "TopicError",
]

publish(__name__, globals(), __all__)
