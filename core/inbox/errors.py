"""What can stop an inbox, and how its errors are told in one line."""

from __future__ import annotations

import os
import sys
import traceback
from typing import TYPE_CHECKING

from pyharvest.core.errors import HarvestError

if TYPE_CHECKING:
    from pyharvest.core.inbox.message import InboxMessage

__all__ = ["HandlerError", "InboxError", "first_line", "where"]


class InboxError(HarvestError):
    """The inbox could not run: no database, no broker, a fatal consumer error."""


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


def first_line(error: BaseException) -> str:
    """The first line of an exception's text: SQLAlchemy appends the statement and its
    parameters on later lines, and parameters may hold data that must not reach logs."""
    lines = str(error).strip().splitlines()
    return lines[0][:500] if lines else ""


# pyharvest's own folders (the package and the three mapped into it, which lie apart in a
# source checkout), found among the modules already loaded: importing them from here would
# make the engine depend on its façade and bindings.
_OWN_PACKAGES = ("pyharvest", "pyharvest.core", "pyharvest.bindings", "pyharvest.plugins")


def where(error: BaseException, frames: int = 3) -> str:
    """`` (at shop.py:12 in apply < billing.py:30 in charge)``: the innermost ``frames`` frames
    of ``error``'s traceback, innermost first, so that a one-line report says where it failed."""
    # The application's frames: pyharvest's own (the call into the handler) say nothing new.
    own = tuple(
        os.path.dirname(module.__file__) + os.sep
        for name in _OWN_PACKAGES
        if (module := sys.modules.get(name)) is not None and module.__file__
    )
    summary = [f for f in traceback.extract_tb(error.__traceback__) if not f.filename.startswith(own)][-frames:]
    if not summary:
        return ""
    return " (at " + " < ".join(
        f"{os.path.basename(f.filename)}:{f.lineno} in {f.name}" for f in reversed(summary)
    ) + ")"
