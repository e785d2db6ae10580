"""What can stop an inbox, and what a caller may catch."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pyharvest.core.inbox.errors import InboxError, first_line

if TYPE_CHECKING:
    from pyharvest.core.inbox.message import InboxMessage

__all__ = ["HandlerError", "InboxError", "first_line"]


class HandlerError(InboxError):
    """The handler raised; under ``errorPolicy: stop`` this stops the inbox and
    :meth:`Inbox.join` re-raises it. The handler's exception is ``__cause__``; nothing of
    the failing transaction was committed, so the message is redelivered on restart."""

    def __init__(self, message: InboxMessage, error: BaseException) -> None:
        super().__init__(
            f"handler failed on {message.topic}[{message.partition}]@{message.offset} "
            f"(delivery {message.delivery_id}): {type(error).__name__}: {first_line(error)}{where(error)}"
        )
        self.message = message
        self.error = error


def where(error: BaseException, frames: int = 3) -> str:
    """`` (at shop.py:12 in apply < billing.py:30 in charge)``: the innermost ``frames`` frames
    of ``error``'s traceback, innermost first, so that a one-line report says where it failed."""
    import os
    import traceback

    # The application's frames: pyharvest's own (the call into the handler) say nothing new.
    own = tuple(os.path.dirname(m.__file__ or "") + os.sep for m in _own_packages())
    summary = [f for f in traceback.extract_tb(error.__traceback__) if not f.filename.startswith(own)][-frames:]
    if not summary:
        return ""
    return " (at " + " < ".join(
        f"{os.path.basename(f.filename)}:{f.lineno} in {f.name}" for f in reversed(summary)
    ) + ")"


def _own_packages() -> tuple[Any, ...]:
    import pyharvest
    from pyharvest import bindings, core, plugins

    return pyharvest, bindings, core, plugins
