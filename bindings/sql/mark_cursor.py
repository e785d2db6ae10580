"""Where a mark starts: past the rows its leader id has already marked (a key-set cursor).

A mark takes the oldest rows not marked by its leader id, walking the primary key from the
lowest id. Every row the leader marked and purged since leaves a dead index entry and a dead
row version behind, which the walk visits until the database cleans them up; while another
session holds the clean-up horizon back (a long transaction, a ``pg_dump``, a replica's
``hot_standby_feedback``), nothing is cleaned, and each mark reads more pages than the last:
the relay slows with the length of the hold (issue 47: p99 14 ms -> 400 ms within 3 minutes).

So a mark starts after the highest id that marks under the same leader id had passed at least
``lookback`` seconds ago: what it walks over is bounded by what was marked and purged in the
last ``lookback`` seconds, however long the horizon is held. Nothing is skipped for good:

* a mark takes the *oldest* ``limit`` unmarked rows above its start, so every row below the
  highest id it returned was taken, except the rows it could not see yet: ids are handed out
  before their transaction commits, so a row can commit after a mark passed its id. A row that
  commits within ``lookback`` of that is found by the next marks, which still start below it;
* a row that commits later than that is found by the :class:`LateRowScanner`, which looks
  below each cursor every ``scan_interval`` seconds on a thread of its own (its read, as slow
  as the old mark under a held horizon, never holds up a mark) and rewinds the cursor to it;
* a new leader id starts from the lowest id (a remark takes every unacknowledged row again),
  and a reset under the cursor's leader id rewinds it to the lowest reset row.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa

__all__ = ["LateRowScanner", "MarkCursor"]

log = logging.getLogger("pyharvest.bindings.sql")


class MarkCursor:
    """The id a mark under a leader id starts after (0: the lowest id). Thread-safe: the mark
    thread moves it, the purge/reset thread and the :class:`LateRowScanner` rewind it."""

    def __init__(self, lookback: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.lookback = lookback
        self._clock = clock
        self._lock = threading.Lock()
        self._leader: str | None = None
        #: (when, the highest id marks under the leader had returned by then), oldest first.
        self._passed: deque[tuple[float, int]] = deque()
        #: Every unmarked row the database showed at or below it was marked at least
        #: ``lookback`` ago: what marks start after.
        self._floor = 0
        #: Below the floor, rows that may be unmarked again (reset, or found late) start above it.
        self._rewound: int | None = None

    def start(self, leader_id: str) -> int:
        """The id the next mark under ``leader_id`` starts after."""
        with self._lock:
            if leader_id != self._leader:
                self._leader, self._floor, self._rewound = leader_id, 0, None
                self._passed.clear()
                return 0
            cutoff = self._clock() - self.lookback
            passed = self._passed
            while passed and passed[0][0] <= cutoff:
                self._floor = max(self._floor, passed.popleft()[1])
            return self._floor if self._rewound is None else min(self._floor, self._rewound)

    def marked(self, leader_id: str, after: int, limit: int, count: int, highest: int) -> None:
        """A mark under ``leader_id`` that started after ``after`` returned ``count`` rows
        (``limit`` at most), the highest id among them ``highest``."""
        with self._lock:
            if leader_id != self._leader:
                return
            rewound = self._rewound
            if rewound is not None and after <= rewound:
                # The mark walked up from the rewind: below its highest id nothing is left unless
                # it stopped at its limit, and then the rest lies above that id.
                self._rewound = highest if count >= limit and highest < self._floor else None
            if count:
                last = self._passed[-1][1] if self._passed else self._floor
                self._passed.append((self._clock(), max(highest, last)))

    def rewind(self, leader_id: str | None, below: int) -> None:
        """Rows above ``below`` may be unmarked again under ``leader_id`` (None: whatever leads)."""
        with self._lock:
            if leader_id is not None and leader_id != self._leader:
                return
            if self._rewound is None or below < self._rewound:
                self._rewound = below

    def position(self) -> tuple[str | None, int]:
        """The leader id and the floor below which only late rows can be unmarked."""
        with self._lock:
            return self._leader, self._floor


class LateRowScanner:
    """Finds rows that committed below a :class:`MarkCursor` after the marks had passed them,
    every ``interval`` seconds, on a thread of its own (started by the first cursor), and
    rewinds the cursor to the lowest. One thread for the cursors of every shard of a table."""

    def __init__(self, engine: sa.Engine, interval: float, what: str) -> None:
        self.engine = engine
        self.interval = interval
        self._what = what
        self._cursors: list[tuple[MarkCursor, Callable[[], sa.Select[Any]]]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._failing = False
        #: Late rows found (each rewound its cursor): what tests and the curious read.
        self.found = 0

    def add(self, cursor: MarkCursor, lowest_unmarked: Callable[[], sa.Select[Any]]) -> None:
        """Scan below ``cursor`` with the statement ``lowest_unmarked()`` gives at each scan
        (the lowest id at or below ``:floor`` a mark under ``:leader_id`` would take; it follows
        the marks' row filters, a quarantine's included)."""
        with self._lock:
            self._cursors.append((cursor, lowest_unmarked))
            if self._thread is None and not self._stop.is_set():
                self._thread = threading.Thread(target=self._run, name=f"pyharvest-late-rows-{self._what}",
                                                daemon=True)
                self._thread.start()

    def scan(self) -> int:
        """Look below every cursor once; how many cursors were rewound."""
        with self._lock:
            cursors = list(self._cursors)
        rewound = 0
        for cursor, statement in cursors:
            leader_id, floor = cursor.position()
            if leader_id is None or floor <= 0:
                continue
            with self.engine.connect() as conn:
                lowest = conn.execute(statement(), {"leader_id": leader_id, "floor": floor}).scalar()
            if lowest is not None:
                log.debug("a row of %s committed after the marks had passed it (id %s): marks go back to it",
                          self._what, lowest)
                cursor.rewind(leader_id, int(lowest) - 1)
                self.found += 1
                rewound += 1
        return rewound

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.scan()
                if self._failing:
                    self._failing = False
                    log.info("the scan for late rows of %s works again", self._what)
            except Exception as e:  # noqa: BLE001 - the thread must outlive any failure, or late rows wait for good
                # The marks go on above the cursor; a row that committed late waits for a scan
                # that works (or for the next leader id, whose first mark starts from the lowest).
                if not self._failing:
                    log.warning("the scan for rows of %s that committed late failed (retried every %gs): %s",
                                self._what, self.interval, e)
                self._failing = True

    def close(self) -> None:
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)
