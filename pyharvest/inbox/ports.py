"""What the inbox calls: the application's handlers. What it reads through (the Kafka
consumer's protocol) is :mod:`pyharvest.core.inbox.ports`, below the bindings that implement it."""

from __future__ import annotations

from collections.abc import Callable

import sqlalchemy as sa

from pyharvest.core.inbox.message import InboxMessage

__all__ = ["BatchHandler", "Handler"]

#: ``handler(tx, message)``: apply ``message`` through ``tx`` (a Connection inside the
#: inbox's transaction: do not commit or roll back). Raise to reject the message.
Handler = Callable[[sa.Connection, InboxMessage], object]

#: ``batch_handler(tx, messages)``: apply ``messages`` (one transaction's, after dedupe, each
#: partition's in offset order) through ``tx``, as one would by applying them one after the
#: other. Raise to reject them: the inbox then finds the message that fails (applying parts
#: of the list in savepoints) and applies the rest without it.
BatchHandler = Callable[[sa.Connection, list[InboxMessage]], object]
