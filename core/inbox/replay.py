"""Replay of dead letters and parked messages that an operator asked for.

Guarantee: the owner of a partition replays a key's stored messages in their arrival
order, in one transaction that first verifies (and locks) the partition's fence, so a
replay never interleaves with a new owner's work or with live messages of the key. The
handler's effects, the dedupe identities and the deletion of the replayed messages commit
together; copies already applied are deleted without being applied again. If one fails
again, the transaction is redone without its effects: the messages before it stay applied,
it becomes the key's dead letter with the new error, the key stays parked and the request
is cleared. See :mod:`pyharvest.core.inbox.letters` for what is stored, and
:mod:`pyharvest.bindings.sql.inbox.deadletters` for how replay is requested.

A batch handler gets the key's messages in one call. If it raises, the transaction is redone
finding the failing message by bisection in savepoints
(:func:`~pyharvest.core.inbox.bisection.first_failure`), and then redone once more without it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, Literal

from pyharvest.core.inbox.bisection import first_failure
from pyharvest.core.inbox.errors import first_line
from pyharvest.core.inbox.letters import DeadLetter, describe_error
from pyharvest.core.inbox.message import InboxMessage
from pyharvest.core.inbox.partitions import Partitions
from pyharvest.core.inbox.ports import BatchHandler, Handler, InboxPorts, TopicPartition
from pyharvest.core.inbox.stats import Counters

__all__ = ["Replayer"]

log = logging.getLogger("pyharvest.inbox")

#: Where a replay failed: the failing message's index among the key's letters, and its error.
_Failure = tuple[int, str]
#: The batch handler failed, on which message is not known yet.
_Unlocated = Literal["unlocated"]


class Replayer:
    """Looks for replay requests on the owned partitions, at most every ``interval`` seconds."""

    def __init__(
        self,
        ports: InboxPorts,
        handler: Handler | None,
        *,
        batch_handler: BatchHandler | None = None,
        partitions: Partitions,
        drop: Callable[[Iterable[TopicPartition], str], None],
        counters: Counters,
        stop: threading.Event,
        interval: float,
    ) -> None:
        self._db = ports.database
        self._handler = handler
        self._batch_handler = batch_handler
        self._partitions = partitions
        self._checkpoints = ports.checkpoints
        self._dedupe = ports.dedupe
        self._dead_letters = ports.dead_letters
        self._drop = drop
        self._counters = counters
        self._stop = stop
        self._interval = interval
        self._last_check = 0.0

    def maybe_replay(self) -> None:
        owned = self._partitions.owned
        now = time.monotonic()
        if not owned or now - self._last_check < self._interval:
            return
        self._last_check = now
        with self._db.connect() as conn:
            wanted = [(tp, kh) for tp in sorted(owned) for kh in self._dead_letters.requested(conn, *tp)]
        for tp, kh in wanted:
            if tp in owned and not self._stop.is_set():
                self.replay(tp, kh)

    def replay(self, tp: TopicPartition, khash: str | None) -> None:
        """Apply a key's stored messages in order, in one fenced transaction (again without
        the failing one's effects, if one fails)."""
        failure: _Failure | None = None
        bisect = False
        while True:
            owned = self._partitions.owned.get(tp)
            if owned is None:
                return
            txn = self._db.begin()
            try:
                conn = txn.connection
                # Also the transaction's first write: savepoints (bisecting) nest inside it.
                if not self._checkpoints.verify(conn, tp, owned.fence):
                    txn.rollback()
                    self._drop([tp], "another consumer took it over (its fence moved)")
                    return
                letters = self._dead_letters.load(conn, tp[0], tp[1], khash)
                outcome = self._replay_letters(conn, letters, failure, bisect)
                if isinstance(outcome, str):  # "unlocated"
                    txn.rollback()
                    bisect = True
                    continue
                if isinstance(outcome, tuple):
                    txn.rollback()
                    failure = outcome
                    continue
                txn.commit()
            finally:
                txn.close()
            if failure is None and khash is not None:
                owned.parked.discard(khash)
            self._counters.add(replayed=outcome)
            if failure is None:
                log.info("replayed %d stored message(s) of %s[%d]", outcome, tp[0], tp[1])
            else:
                log.warning("replay of %s[%d] stopped at a message that failed again; it is dead-lettered anew", *tp)
            return

    def _replay_letters(
        self, conn: Any, letters: list[DeadLetter], failure: _Failure | None, bisect: bool
    ) -> int | _Failure | _Unlocated:
        """Apply ``letters`` up to ``failure`` (if known); returns how many were applied, or
        the new failure (located or not), which leaves the transaction to be rolled back."""
        end = len(letters) if failure is None else failure[0]
        sources = {L.message.source for L in letters[:end] if L.message.source is not None}
        known = self._dedupe.applied(conn, sources) if sources else set()
        done: list[int] = []
        todo: list[tuple[int, InboxMessage]] = []
        for i, letter in enumerate(letters[:end]):
            m = letter.message
            done.append(letter.id)
            if m.source is not None:
                if m.source in known:
                    continue  # a copy of a message applied already: deleted, not applied
                known.add(m.source)
            todo.append((i, m))
        outcome = self._apply(conn, todo, bisect, known_to_fail=failure is None)
        if outcome is not None:
            return outcome
        if failure is not None:
            i, error = failure
            self._dead_letters.fail_again(conn, letters[i], error, [x.id for x in letters[i + 1 :]])
        self._dead_letters.delete(conn, done)
        self._dedupe.remember(conn, [m for _, m in todo])
        return len(todo)

    def _apply(
        self, conn: Any, todo: list[tuple[int, InboxMessage]], bisect: bool, known_to_fail: bool
    ) -> _Failure | _Unlocated | None:
        """Apply ``todo`` (letter index, message) with the handler; None if all applied."""
        located: tuple[int, InboxMessage, Exception] | None = None
        if self._handler is not None:
            for i, m in todo:
                try:
                    self._handler(conn, m)
                except Exception as error:
                    if self._db.connection_lost(error):
                        raise
                    located = i, m, error
                    break
        elif todo:
            handler = self._batch_handler
            assert handler is not None
            messages = [m for _, m in todo]
            if not bisect:
                try:
                    handler(conn, messages)
                except Exception as error:
                    if self._db.connection_lost(error):
                        raise
                    log.info(
                        "replayed messages failed again (%s: %s); finding which",
                        type(error).__name__,
                        first_line(error),
                    )
                    return "unlocated"
            else:
                found = first_failure(self._db, conn, handler, messages, known_to_fail=known_to_fail)
                if found is not None:
                    located = (*todo[found[0]], found[1])
        if located is None:
            return None
        i, m, e = located
        log.warning("replayed message %r failed again: %s: %s", m, type(e).__name__, first_line(e))
        return i, describe_error(e)
