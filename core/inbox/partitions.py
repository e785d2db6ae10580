"""The partitions this consumer owns, and the fence it holds on each.

Guarantee: a partition's messages are applied only after this consumer bumped the
partition's fence in a committed transaction of its own (:meth:`Partitions.claim`), and
every later transaction for it is checked against that fence (see
:class:`~pyharvest.core.inbox.ports.CheckpointStore`); the offset the claim read back is where consuming
resumes, whatever Kafka's own committed offset says.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from dataclasses import dataclass

from pyharvest.core.inbox.errors import first_line
from pyharvest.core.inbox.ports import InboxPorts, TopicPartition

__all__ = ["Owned", "Partitions"]

log = logging.getLogger("pyharvest.inbox")

_MAX_CLAIM_ATTEMPTS = 30
_MAX_CLAIM_PAUSE = 5.0


@dataclass(slots=True)
class Owned:
    """A partition this consumer claimed."""

    fence: int
    committed: int | None  # next offset committed to the database (None: none yet)
    parked: set[str]  # key hashes with stored messages


class Partitions:
    """Claims partitions (bumping their fences) and keeps what this consumer owns in :attr:`owned`."""

    def __init__(
        self,
        ports: InboxPorts,
        *,
        stop: threading.Event,
        backoff: float,
    ) -> None:
        self.owned: dict[TopicPartition, Owned] = {}
        self._db = ports.database
        self._checkpoints = ports.checkpoints
        self._dead_letters = ports.dead_letters
        self._stop = stop
        self._backoff = backoff

    def claim(self, tps: list[TopicPartition]) -> dict[TopicPartition, int | None]:
        """Take ``tps`` over; returns each one's next offset committed to the database."""
        claimed = self._claim(tps) if tps else {}
        self.owned.update(claimed)
        return {tp: owned.committed for tp, owned in claimed.items()}

    def _claim(self, tps: list[TopicPartition]) -> dict[TopicPartition, Owned]:
        attempt = 0
        while True:
            try:
                tx = self._db.begin()
                try:
                    claims = self._checkpoints.claim(tx.connection, tps)
                    owned = {
                        tp: Owned(c.fence, c.next_offset, self._dead_letters.parked_keys(tx.connection, *tp))
                        for tp, c in claims.items()
                    }
                    tx.commit()
                    return owned
                finally:
                    tx.close()
            except self._db.failures as e:
                attempt += 1
                # IntegrityError: a first claim raced another's; anything else: the database.
                log.warning("claiming partitions failed (attempt %d): %s", attempt, first_line(e))
                if self._stop.wait(min(self._backoff * attempt, _MAX_CLAIM_PAUSE)) or attempt >= _MAX_CLAIM_ATTEMPTS:
                    raise

    def release(self, tps: Iterable[TopicPartition]) -> list[TopicPartition]:
        """Forget ``tps``; returns those that were owned."""
        return [tp for tp in tps if self.owned.pop(tp, None) is not None]

    def clear(self) -> None:
        self.owned.clear()
