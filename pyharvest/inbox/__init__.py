"""The consuming side of the outbox: apply Kafka messages to a database exactly once.

>>> from pyharvest.inbox import Inbox, InboxConfig
>>> def apply(tx, message):                               # doctest: +SKIP
...     tx.execute(credit, {"account": message.key_text, "amount": int(message.value)})
>>> config = InboxConfig(base_kafka_config={"bootstrap.servers": "localhost:9092"},
...                      group_id="billing-inbox", topics=["payments"],
...                      data_source="postgresql+psycopg://app@localhost/app")
>>> with Inbox(config, apply) as inbox:                   # doctest: +SKIP
...     inbox.join()

See ``docs/inbox.md`` for the guarantees and the tables.
"""

from pyharvest._public import publish
from pyharvest.bindings.sql.bulk_insert import BulkInsert
from pyharvest.bindings.sql.inbox.deadletters import list_dead_letters, request_replay
from pyharvest.bindings.sql.inbox.tables import InboxTables
from pyharvest.core.inbox.letters import DeadLetter
from pyharvest.core.inbox.message import OUTBOX_HEADER, RECORD_ID_HEADER, InboxMessage, delivery_id_for, source_identity
from pyharvest.core.inbox.stats import InboxStats
from pyharvest.inbox.config import ERROR_POLICIES, InboxConfig, InboxFile, InboxLimits
from pyharvest.inbox.runner import BatchHandler, Handler, Inbox

__all__ = [
    "ERROR_POLICIES",
    "OUTBOX_HEADER",
    "RECORD_ID_HEADER",
    "BatchHandler",
    "BulkInsert",
    "DeadLetter",
    "Handler",
    "Inbox",
    "InboxConfig",
    "InboxFile",
    "InboxLimits",
    "InboxMessage",
    "InboxStats",
    "InboxTables",
    "delivery_id_for",
    "list_dead_letters",
    "request_replay",
    "source_identity",
]

publish(__name__, globals(), __all__)
