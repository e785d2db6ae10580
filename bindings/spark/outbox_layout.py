"""The outbox columns the Spark writer fills, taken from the SQL binding's native layout.

Kept in one place so that a change of the layout shows up here (the assertion below fails at
import) rather than as SQL errors inside Spark tasks.
"""

from __future__ import annotations

from pyharvest.plugins.api import (
    EMPTY_HEADERS,
    KEY_HASH_COLUMN,
    KEY_LENGTH,
    NATIVE,
    TOPIC_LENGTH,
    OutboxTable,
    TableName,
    encode_headers,
)

__all__ = [
    "CREATE_TIME",
    "EMPTY_HEADERS",
    "HEADERS",
    "ID",
    "KEY",
    "KEY_HASH",
    "KEY_LENGTH",
    "PAYLOAD_COLUMNS",
    "TOPIC",
    "TOPIC_LENGTH",
    "VALUE",
    "encode_headers",
    "native_outbox",
]

ID = "id"
CREATE_TIME = "create_time"
TOPIC = "kafka_topic"
KEY = "kafka_key"
VALUE = "kafka_value"
HEADERS = "kafka_headers"
# What a staged record carries, in the order the row converters produce it.
PAYLOAD_COLUMNS = (TOPIC, KEY, VALUE, HEADERS)
# The shard key hash, staged after the payload when the outbox has the column.
KEY_HASH = KEY_HASH_COLUMN


def native_outbox(name: TableName) -> OutboxTable:
    return OutboxTable.build(name, NATIVE)


_known = {c.name for c in OutboxTable.build(TableName("outbox"), NATIVE, key_hash=True).table.columns}
assert {ID, CREATE_TIME, *PAYLOAD_COLUMNS, KEY_HASH} <= _known, f"outbox layout changed: {sorted(_known)}"
