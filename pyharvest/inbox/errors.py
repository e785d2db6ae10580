"""What can stop an inbox, and what a caller may catch."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyharvest.core.errors import HarvestError

if TYPE_CHECKING:
    from pyharvest.inbox.message import InboxMessage

__all__ = ["HandlerError", "InboxError"]


class InboxError(HarvestError):
    """The inbox could not run: no database, no broker, a fatal consumer error."""


class HandlerError(InboxError):
    """The handler raised; under ``errorPolicy: stop`` this stops the inbox and
    :meth:`Inbox.join` re-raises it. The handler's exception is ``__cause__``; nothing of
    the failing transaction was committed, so the message is redelivered on restart."""

    def __init__(self, message: InboxMessage, error: BaseException) -> None:
        super().__init__(
            f"handler failed on {message.topic}[{message.partition}]@{message.offset} "
            f"(delivery {message.delivery_id}): {type(error).__name__}: {first_line(error)}"
        )
        self.message = message
        self.error = error


def first_line(error: BaseException) -> str:
    """The first line of an exception's text: SQLAlchemy appends the statement and its
    parameters on later lines, and parameters may hold data that must not reach logs."""
    lines = str(error).strip().splitlines()
    return lines[0][:500] if lines else ""
