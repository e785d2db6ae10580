"""A static member's first assignment, held back in case a live namesake still leads it.

A second live process with the same ``group.instance.id`` takes the first one's shards, and the
broker fences the older one at its next group heartbeat. So a static member leads the shards of
its first assignment only once two group heartbeat intervals (and a poll) have passed, by when
such a namesake has been told and stepped down: the *whole hold*.

Most restarts have no namesake: the process was killed and the new one takes its shards back.
A leader sends a heartbeat to each shard's partition at every pulse (each ``minPollInterval``),
each marked with its process's token (:mod:`~pyharvest.core.election.heartbeats`). So the hold
counts from the shard's last heartbeat before the assignment (read when the shard is assigned,
on a thread of its own, while the group's consumer finds its position), rather than from the
assignment: a holder that has been silent for the whole
hold is not pulsing, as the whole hold assumes of a live one. The shard is led once

* the whole hold has passed since that last heartbeat was sent (by its sender's clock),
* a short window (``5 x minPollInterval``) has passed since the assignment, and
* one of this process's own heartbeats has come back on it, with no other process's beside it.

A heartbeat of another process while the shard is held (a namesake started at the same time,
or one whose clock lags this one's) gives the shard its whole hold from the assignment, as
before. A kill -9 and an immediate restart leads about a whole hold after the kill, however
long the new process took to start, rather than a whole hold after its start-up.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from pyharvest.core.election.heartbeats import HeartbeatSender, parse_heartbeat
from pyharvest.core.election.leader_watch import LeaderWatch

__all__ = ["StaticHold"]

log = logging.getLogger("pyharvest.neli")


@dataclass(slots=True)
class _Held:
    assigned: float  # monotonic
    until: float  # monotonic: led then whatever the heartbeats said
    shorten: bool  # no other process's heartbeat seen while held
    own_back: bool = False


class StaticHold:
    def __init__(
        self,
        whole: float,
        window: float,
        token: str,
        watch: LeaderWatch | None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.whole = whole
        self.window = window
        self._token = token
        self._watch = watch
        self._clock = clock
        self._wall_clock = wall_clock
        self._held: dict[int, _Held] = {}
        self._prior: dict[int, HeartbeatSender] | None = None
        self._reading: threading.Thread | None = None
        self._may_shorten = False

    def begin(self, reads_heartbeats: bool) -> None:
        """At start: ``reads_heartbeats``, whether the group's consumer gives the heartbeats'
        values (else this process cannot tell its own from a namesake's, and every hold is whole)."""
        self._may_shorten = self._watch is not None and reads_heartbeats

    def _read(self) -> None:
        assert self._watch is not None
        self._prior = self._watch.read()

    def __contains__(self, shard: int) -> bool:
        return shard in self._held

    @property
    def reading(self) -> bool:
        """While the last heartbeats are read, this process sends none to its held shards: the
        read would find its own."""
        return self._reading is not None and self._reading.is_alive()

    def hold(self, shard: int) -> str:
        """Hold ``shard`` (just assigned); what the log says of it."""
        now = self._clock()
        self._held[shard] = _Held(now, now + self.whole, self._may_shorten)
        if self._may_shorten and self._reading is None:
            # Read now, not at start: a namesake's heartbeat sent while this process joined
            # would be neither read nor seen by the group's consumer (it starts at the end).
            self._reading = threading.Thread(target=self._read, name="pyharvest-last-heartbeats", daemon=True)
            self._reading.start()
        if not self._may_shorten:
            return (f"; leading it in {self.whole:.1f}s, once a live process with the same instanceID would have "
                    "been fenced")
        return (f"; leading it once {self.whole:.1f}s have passed since its last heartbeat (a live process with the "
                "same instanceID would have been fenced by then) and this process's own heartbeat is back")

    def note(self, beats: list[tuple[int, bytes | None]]) -> None:
        """The heartbeats a poll read: this process's own, or another's on a held shard."""
        for p, value in beats:
            held = self._held.get(p)
            if held is None or not held.shorten:
                continue
            sender = parse_heartbeat(value)
            if sender is not None and sender.token == self._token:
                held.own_back = True
                continue
            log.info("shard %d: a heartbeat of another process (%s) arrived while this one holds the shard back: "
                     "holding it the whole %.1fs", p, sender.describe() if sender else "unknown", self.whole)
            held.shorten = False

    def due(self) -> list[int]:
        """The held shards that may be led now (no longer held)."""
        now = self._clock()
        out = []
        for p, held in sorted(self._held.items()):
            if now >= held.until or (held.shorten and self._silent_long_enough(p, held, now)):
                del self._held[p]
                out.append(p)
        return out

    def _silent_long_enough(self, shard: int, held: _Held, now: float) -> bool:
        if not held.own_back or now < held.assigned + self.window:
            return False
        if self.reading:
            return False
        prior = self._prior
        if prior is None:  # the read failed: nothing known of the last holder
            return False
        last = prior.get(shard)
        silent = self._wall_clock() - last.sent_at if last is not None else None
        if silent is not None and silent < self.whole:
            return False
        log.info("shard %d: leading it %.2fs after its assignment: %s", shard, now - held.assigned,
                 f"its last heartbeat before this process ({last.describe()}) was sent {silent:.1f}s ago"
                 if last is not None and silent is not None else "it had no heartbeat before this process")
        return True

    def drop(self, shard: int) -> None:
        self._held.pop(shard, None)

    def clear(self) -> None:
        self._held.clear()
