"""Dead letters and parked messages: what the inbox stores instead of applying.

Under ``errorPolicy: dead-letter`` a message whose handler fails is stored with its error
(:data:`DEAD`) and the consumer moves on. So that per-key order is never broken silently,
every later message of the same key in that partition is stored too, not applied
(:data:`PARKED`), until the key is replayed; a key is known by its :func:`key_hash`. Messages
without a key have no order to keep: only the failing message itself is stored.

Replay is done by the consumer that owns the partition, inside its fenced transactions
(:mod:`pyharvest.core.inbox.replay`); an operator only asks for it.
"""

from __future__ import annotations

import hashlib
import traceback
from dataclasses import dataclass
from datetime import datetime

from pyharvest.core.inbox.message import InboxMessage

__all__ = ["DEAD", "PARKED", "DeadLetter", "describe_error", "key_hash"]

#: A stored message whose handler failed.
DEAD = "dead"
#: A stored message of a key with a dead letter, waiting behind it.
PARKED = "parked"

_ERROR_LIMIT = 8000


def key_hash(key: bytes | None) -> str | None:
    """How a dead letter's key is stored and looked up: indexable whatever the key's length."""
    return None if key is None else hashlib.sha256(key).hexdigest()


def describe_error(error: BaseException) -> str:
    """The error as stored for the operator: the exception and its traceback, bounded."""
    text = "".join(traceback.format_exception(error))
    return text if len(text) <= _ERROR_LIMIT else text[: _ERROR_LIMIT - 20] + "\n… (truncated)"


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A stored message: ``status`` is ``dead`` (its handler failed) or ``parked``."""

    id: int
    status: str
    message: InboxMessage
    error: str | None
    failed_at: datetime
    replay_requested: bool
