"""Who leads each shard, for a member that does not: the last heartbeat of each leader-topic
partition names its sender (:func:`~pyharvest.core.election.heartbeats.parse_heartbeat`).

A standby is not assigned the partitions it does not lead, so the group's consumer never reads
their heartbeats; asking the group coordinator (``DescribeGroups``) names members, not who
leads, and goes through the admin client (see ``bindings/kafka/cluster_probes.py``). So the
watch reads each partition's last message with a consumer of no group (it joins nothing and
commits nothing), on a thread of its own, at most once per ``interval`` and only when someone
asks (the status page, ``/readyz``): a standby nobody looks at reads nothing."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from pyharvest.core.election.heartbeats import HeartbeatSender, parse_heartbeat
from pyharvest.core.ports.kafka import KafkaConfigMap, LeaderTopicReader

__all__ = ["LeaderSeen", "LeaderWatch"]

log = logging.getLogger("pyharvest.neli")


@dataclass(frozen=True, slots=True)
class LeaderSeen:
    """A shard's leader as its last heartbeat names it; ``age`` is seconds since it was sent
    (by the sender's clock: hosts' clocks may differ)."""

    sender: HeartbeatSender
    age: float


class LeaderWatch:
    def __init__(
        self,
        reader: LeaderTopicReader,
        kafka_config: KafkaConfigMap,
        topic: str,
        shards: int,
        interval: float,
        wall_clock: Callable[[], float] = time.time,
        timeout: float = 5.0,
    ) -> None:
        self._reader = reader
        self._config = dict(kafka_config)
        self._topic = topic
        self._shards = shards
        self._interval = interval
        self._wall_clock = wall_clock
        self._timeout = timeout
        self._lock = threading.Lock()
        self._senders: dict[int, HeartbeatSender] = {}
        self._read_at: float | None = None
        self._reading: threading.Thread | None = None

    def read(self) -> dict[int, HeartbeatSender] | None:
        """Read the last heartbeats now, on the calling thread; None if they could not be read
        (what was known is kept)."""
        try:
            values = self._reader.last_heartbeats(self._config, self._topic, self._shards, self._timeout)
        except Exception as e:  # noqa: BLE001 - a status line, never a reason to stop
            log.debug("reading the leader topic's last heartbeats: %s", e)
            return None
        senders = {p: s for p, v in values.items() if (s := parse_heartbeat(v)) is not None}
        with self._lock:
            self._senders = senders
        return senders

    def leaders(self) -> dict[int, LeaderSeen]:
        """The shards' leaders as last read; starts a read in the background when the last
        one is older than ``interval`` (so the first call may find nothing yet)."""
        now = time.monotonic()
        with self._lock:
            due = self._read_at is None or now - self._read_at >= self._interval
            if due and (self._reading is None or not self._reading.is_alive()):
                self._read_at = now
                self._reading = threading.Thread(target=self.read, name="pyharvest-leader-watch", daemon=True)
                self._reading.start()
            senders = dict(self._senders)
        wall = self._wall_clock()
        return {p: LeaderSeen(s, max(0.0, wall - s.sent_at)) for p, s in senders.items()}
