"""The keys held back by delivery errors (:class:`BlockedKeys`): under ``poisonPolicy: block``
a record Kafka refuses for good is retried forever and its key's later records wait behind it
(under ``quarantine``, until ``maxDeliveryAttempts``). Nothing else says so: the relay still
serves every other key, so it stays ready. This record is what the status page, ``/readyz``,
the ``pyharvest_blocked_keys`` gauge and :attr:`pyharvest.Harvest.blocked_keys` show.

A key leaves the record when its record finally goes through, is quarantined, or is gone from
the outbox (an operator deleted the row). The engine cannot ask the database whether a row
still exists (no port does), but a mark tells it: a mark returns the *oldest* rows not marked
under the current leader id, sorted by id, so after a remark a blocked row that still exists
comes back in the first mark that returns a row with a larger id, or that returns fewer rows
than asked for (the outbox ran dry). A mark that passes it by means the row is gone.

Written by the delivery thread (failures, deliveries) and the main loop (marks), read by
exporters' threads: one lock.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from pyharvest.core.outbox.records import OutboxRecord
from pyharvest.core.telemetry.logs import log

__all__ = ["MAX_BLOCKED_SHOWN", "BlockedKey", "BlockedKeys"]

#: Keys described in full at most; beyond, only counted (:attr:`BlockedKeys.total`).
MAX_BLOCKED_SHOWN = 100


@dataclass(frozen=True, slots=True)
class BlockedKey:
    """A key held back by a record Kafka refuses for good: the record is retried and the key's
    later records wait behind it. ``since`` is when the record first failed (seconds since the
    epoch), ``attempts`` how often it has failed so far, ``error`` the last refusal."""

    key: str
    topic: str
    record_id: int | None
    error: str
    attempts: int
    since: float
    #: The shard whose engine retries it, when the outbox is sharded.
    shard: int | None = None


class BlockedKeys:
    """The blocked keys of one engine, by key; :meth:`snapshot` describes at most
    :data:`MAX_BLOCKED_SHOWN` of them, :attr:`total` counts them all. The record itself is
    bounded by the window: every blocked record was marked and sent, and while it exists it is
    among the oldest rows, which every remark takes first. Records without an id (never read
    back from an outbox) are not kept."""

    def __init__(self, shard: int | None = None, limit: int = MAX_BLOCKED_SHOWN) -> None:
        self._shard = shard
        self._limit = limit
        self._lock = threading.Lock()
        self._by_key: dict[str, BlockedKey] = {}
        self._key_of: dict[int, str] = {}
        # The leader id under which a blocked record was last marked: a mark under the same id
        # never returns it again (it is in flight, or parked, under that id).
        self._marked_under: dict[int, str | None] = {}
        #: How many keys are blocked: a plain attribute, so that the per-record path asks it
        #: without a call (most of the time none is, and nothing here runs).
        self.count = 0

    # ------------------------------------------------------------------ what is read

    @property
    def total(self) -> int:
        """How many keys are blocked, described in :meth:`snapshot` or not."""
        return self.count

    def __bool__(self) -> bool:
        return self.count > 0

    def snapshot(self) -> tuple[BlockedKey, ...]:
        """The longest blocked keys first, at most :data:`MAX_BLOCKED_SHOWN`."""
        with self._lock:
            entries = list(self._by_key.values())
        entries.sort(key=lambda b: (b.since, b.key))
        return tuple(entries[: self._limit])

    # ------------------------------------------------------------------ what writes

    def failed(self, record: OutboxRecord, error: str, attempts: int) -> None:
        """``record`` was refused for good and will be retried: its key is blocked."""
        rid = record.id
        if rid is None:
            return
        with self._lock:
            key = record.key
            known = self._by_key.get(key)
            if known is not None and known.record_id == rid:
                self._by_key[key] = replace(known, error=error, attempts=attempts)
                return
            if known is not None:  # an earlier record of the key is gone: this one blocks it now
                self._forget(known.record_id)
            self._by_key[key] = BlockedKey(key, record.topic, rid, error, attempts, time.time(), self._shard)
            self._key_of[rid] = key
            self._marked_under[rid] = record.leader_id
            self.count = len(self._by_key)

    def settled(self, ids: Iterable[int], how: str) -> list[BlockedKey]:
        """These records went through or were quarantined (``how``): their keys are free.
        Returns the keys freed."""
        if not self.count:
            return []
        with self._lock:
            freed = [f for rid in ids if rid in self._key_of and (f := self._forget(rid)) is not None]
        for entry in freed:
            log.info(
                "key %r is no longer held back: its record %s %s after %d failed attempt%s",
                entry.key, entry.record_id, how, entry.attempts, "" if entry.attempts == 1 else "s",
            )
        return freed

    def marked(self, leader_id: str, records: Sequence[OutboxRecord], asked: int) -> list[BlockedKey]:
        """A mark under ``leader_id`` asked for ``asked`` rows and returned ``records`` (sorted
        by id, the oldest first): a blocked record it passed by is gone from the outbox and
        freed. Returns the keys freed."""
        if not self.count:
            return []
        marked_ids = {r.id for r in records}
        # How far the mark reached: past the last id returned, unless the outbox ran dry.
        reach = records[-1].id if records and len(records) >= asked else None
        gone: list[BlockedKey] = []
        with self._lock:
            for rid, under in list(self._marked_under.items()):
                if under == leader_id:
                    continue  # taken by an earlier mark under this id: it is on its way
                if rid in marked_ids:
                    self._marked_under[rid] = leader_id
                elif (reach is None or reach > rid) and (entry := self._forget(rid)) is not None:
                    gone.append(entry)
        for entry in gone:
            log.info("key %r is no longer held back: its record %s is gone from the outbox", entry.key,
                     entry.record_id)
        return gone

    def clear(self) -> None:
        """Nothing is retried here any more (leadership lost: the next leader retries)."""
        with self._lock:
            self._by_key.clear()
            self._key_of.clear()
            self._marked_under.clear()
            self.count = 0

    def _forget(self, rid: int | None) -> BlockedKey | None:
        # Called with the lock held.
        if rid is None:
            return None
        self._marked_under.pop(rid, None)
        key = self._key_of.pop(rid, None)
        if key is not None and (entry := self._by_key.get(key)) is not None and entry.record_id == rid:
            del self._by_key[key]
            self.count = len(self._by_key)
            return entry
        return None
