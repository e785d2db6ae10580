"""When to replace a stuck Kafka client: no progress for three group session timeouts while the
cluster answers a fresh client.

librdkafka recovers from almost every fault by itself, and the engine replaces a client after
a fatal error. What neither covers is a client that stays alive and quietly stops: seen, a
leader consumer that never rejoined its group after the broker froze and reloaded its group
coordinator, leaving the harvester a standby for good. A harvester that stops harvesting
until a person restarts it is the worst failure an outbox can have, so each client's owner
(:mod:`pyharvest.bindings.kafka`) keeps a :class:`ProgressWatch` and replaces the client when
the watch says so.

A client is stuck when both hold:

* it made no progress for :data:`HEAL_AFTER_SESSIONS` group session timeouts while it had
  work: a leader consumer that is not a steady member of its group, a producer whose messages
  get no answer from a broker (an error the broker sent, such as ``NOT_ENOUGH_REPLICAS``,
  counts as an answer), a transactional producer that commits nothing;
* a fresh client of the same configuration gets, now, what this one waits for (the group's
  coordinator answers; the partition leaders answer and have their in-sync replicas). While
  the cluster is down or cut off, a new client would fare no better: nothing is replaced,
  and the clock keeps running, so that the replacement comes as soon as the cluster answers.

Why three sessions: a group rebalance or a leader election ends within one session, and a
broker's restart within two; a replacement costs a rejoin (a rebalance of the group) or a new
producer id, so it must not race a fault that heals by itself.

This module holds the policy (the clock, the probe's thread, the log line); the count is
:mod:`pyharvest.core.telemetry.client_restarts`. It knows nothing of any client library.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from pyharvest.core.election.group_protocol import wanted_session
from pyharvest.core.telemetry.client_restarts import restarts
from pyharvest.core.telemetry.logs import log, one_line
from pyharvest.core.telemetry.repeats import CollapsingLogger

__all__ = [
    "HEAL_AFTER_SESSIONS",
    "ClusterProbe",
    "ProbeAnswer",
    "ProgressWatch",
    "heal_after",
]

HEAL_AFTER_SESSIONS = 3

_kept = CollapsingLogger(log)


def heal_after(heartbeat_timeout: float, session_seconds: float | None = None) -> float:
    """Seconds without progress after which a client may be replaced: three sessions of the
    leader group (the session ``heartbeatTimeout`` asks for, or ``session_seconds`` when the
    broker set a longer one)."""
    session = wanted_session(heartbeat_timeout).session_ms / 1000
    return HEAL_AFTER_SESSIONS * max(session, session_seconds or 0.0)


@dataclass(frozen=True, slots=True)
class ProbeAnswer:
    """What a fresh client got: whether the cluster answers it what the watched client waits
    for, and what it saw (for the log line, and for a probe that saw why not)."""

    answers: bool
    detail: str


#: Asks the cluster, with a fresh client, within the given seconds. Run on a thread of its
#: own; an exception counts as "does not answer".
ClusterProbe = Callable[[float], ProbeAnswer]


class ProgressWatch:
    """One client's progress, and the decision to replace it.

    The client's owner calls :meth:`progressed` on progress (and while it has no work: idle
    is not stuck) and :meth:`stuck` now and then from its own thread; both are cheap and never
    wait. Once there was no progress for ``after`` seconds, :meth:`stuck` starts ``probe`` on
    a thread of its own (one at a time, at most every ``after / 3`` seconds) and answers True
    once a probe found the cluster answering. The owner then replaces the client and calls
    :meth:`replaced`, which logs and counts it and starts the clock again."""

    def __init__(
        self,
        client: str,
        after: float,
        probe: ClusterProbe,
        *,
        clock: Callable[[], float] = time.monotonic,
        probe_timeout: float = 5.0,
    ) -> None:
        self.client = client
        self.after = after
        self._probe = probe
        self._clock = clock
        self._probe_timeout = probe_timeout
        self._lock = threading.Lock()
        self._since = clock()
        self._probing = False
        self._probed_at = float("-inf")
        self._verdict: ProbeAnswer | None = None

    def progressed(self) -> None:
        self._since = self._clock()
        self._verdict = None

    def stuck(self) -> bool:
        now = self._clock()
        if now - self._since < self.after:
            return False
        verdict = self._verdict
        if verdict is not None and verdict.answers:
            return True
        with self._lock:
            if self._probing or now - self._probed_at < self.after / 3:
                return False
            self._probing, self._probed_at, since = True, now, self._since
        threading.Thread(target=self._run_probe, args=(since,), name=f"pyharvest-probe-{self.client}",
                         daemon=True).start()
        return False

    def _run_probe(self, since: float) -> None:
        try:
            answer = self._probe(self._probe_timeout)
        except Exception as e:  # noqa: BLE001 - a probe that fails saw a cluster that does not answer
            answer = ProbeAnswer(False, one_line(e))
        with self._lock:
            self._probing = False
            if since == self._since:  # no progress meanwhile: the verdict stands
                self._verdict = answer
        if not answer.answers:  # through a whole outage: once, then a count now and then
            _kept.log(logging.INFO, "the Kafka %s has made no progress for %.0fs, but a fresh client fares no "
                      "better (%s): kept", self.client.replace("_", " "), self._clock() - since, answer.detail,
                      cause=f"{self.client}: {answer.detail}")

    def replaced(self, why: str = "") -> None:
        """The owner replaced the client: log it, count it, start the clock again."""
        verdict = self._verdict
        log.warning(
            "replaced the stuck Kafka %s: no progress for %.0fs (%d group session timeouts)%s, while a fresh "
            "client of the same configuration got answers (%s)",
            self.client.replace("_", " "), self._clock() - self._since, HEAL_AFTER_SESSIONS,
            f", {why}" if why else "",
            verdict.detail if verdict is not None else "probe",
        )
        restarts.count(self.client)
        self.progressed()
