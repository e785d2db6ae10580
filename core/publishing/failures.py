"""A record's failed attempts and the poison policy's verdicts on them (:class:`FailedAttempts`),
and how a batch's failures are named in the log (:func:`name_failures`).

Both delivery modes judge failures here, through their :class:`~pyharvest.core.publishing.settlement.Settlement`;
they differ in what they do with the verdicts (reset and remark, or park a key out of the next
transactions), not in the verdicts themselves.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from pyharvest.core.config.settings import Config
from pyharvest.core.outbox.records import OutboxRecord
from pyharvest.core.ports.database import QuarantineEntry
from pyharvest.core.ports.kafka import DeliveryError
from pyharvest.core.publishing.blocked_keys import BlockedKeys
from pyharvest.core.publishing.poison_hints import poison_hint, quarantine_hint
from pyharvest.core.telemetry.events import DeliveryFailed, Event, RecordQuarantined
from pyharvest.core.telemetry.logs import log
from pyharvest.core.telemetry.metrics import HarvestMetrics
from pyharvest.core.telemetry.repeats import CollapsingLogger

__all__ = ["NAMED_FAILURES", "FailedAttempts", "Verdicts", "name_failures"]

#: Failing records a log line names at most; the rest are counted.
NAMED_FAILURES = 10


def name_failures(failures: Sequence[tuple[OutboxRecord, object]], bound: int = NAMED_FAILURES) -> str:
    """Each failing record of a batch by id and key with its error, up to ``bound``, then
    how many more: an operator must be able to find every key a batch holds back."""
    named = "; ".join(f"record {rec.id} key {rec.key!r}: {err}" for rec, err in failures[:bound])
    rest = len(failures) - bound
    return f"{named}; and {rest} more" if rest > 0 else named


@dataclass(slots=True)
class Verdicts:
    """What a batch of failures comes to: the positions of the failures to retry, the records
    to quarantine, how many were poison (refused for good), and whether the producer is
    broken (a fatal error)."""

    retry: list[int] = field(default_factory=list)
    quarantine: list[QuarantineEntry] = field(default_factory=list)
    poison: int = 0
    fatal: bool = False


class FailedAttempts:
    """Failed attempts per record id (only records that failed appear), the poison policy's
    verdicts, the events and metrics of each failure and quarantine, the keys a poison record
    holds back (``blocked``), and the advice on each poison record, logged once per key and
    error, then collapsed (a blocked key is retried every few seconds, for as long as it lasts)."""

    def __init__(
        self,
        config: Config,
        metrics: HarvestMetrics,
        emit: Callable[[Event], None],
        blocked: BlockedKeys | None = None,
    ) -> None:
        self._config = config
        self._metrics = metrics
        self._emit = emit
        self._blocked = blocked if blocked is not None else BlockedKeys()
        self._advice = CollapsingLogger(log)
        self._advised = False
        self._attempts: dict[int, int] = {}
        # The producer's settings name the principal in an ACL's refusal (the user, never a secret).
        self._kafka_config = {**config.base_kafka_config, **config.producer_kafka_config}
        # Each record's first refusal for good: later attempts can fail for a consequence of it
        # (an invalid topic name is TOPIC_EXCEPTION once, then librdkafka's cached
        # _UNKNOWN_TOPIC), whose hint ("create it") would send the operator the wrong way.
        self._first_poison: dict[int, DeliveryError] = {}

    def judge(self, failures: Sequence[tuple[OutboxRecord, DeliveryError]], quarantine_on: bool) -> Verdicts:
        """Count each failure, emit :class:`DeliveryFailed`, and quarantine a poison record
        once it failed ``maxDeliveryAttempts`` times (when ``quarantine_on``)."""
        config, metrics, attempts_of = self._config, self._metrics, self._attempts
        max_attempts = config.limits.max_delivery_attempts or 1
        verdicts = Verdicts()
        for i, (rec, err) in enumerate(failures):
            metrics.delivery_errors[err.code] = metrics.delivery_errors.get(err.code, 0) + 1
            attempts = 1
            if rec.id is not None:
                attempts = attempts_of.get(rec.id, 0) + 1
                attempts_of[rec.id] = attempts
            hint, cause = "", err
            if not err.retriable:
                verdicts.poison += 1
                if rec.id is not None:
                    cause = self._first_poison.setdefault(rec.id, err)
                policy = config.poison_policy if quarantine_on else "block"
                hint = poison_hint(cause.code, rec.topic, policy, self._kafka_config)
                self._advise(rec, cause, hint)
            verdicts.fatal = verdicts.fatal or err.fatal
            self._emit(DeliveryFailed(rec.id, rec.key, rec.topic, str(err), err.retriable, attempts, hint))
            if quarantine_on and not err.retriable and attempts >= max_attempts:
                verdicts.quarantine.append(QuarantineEntry(rec, str(cause), attempts))
            else:
                verdicts.retry.append(i)
                if not err.retriable:
                    self._blocked.failed(rec, str(cause), attempts)
        return verdicts

    def _advise(self, rec: OutboxRecord, cause: DeliveryError, hint: str) -> None:
        """What to do about a poison record: the full advice the first time a key fails with
        an error, a count of its repeats once per interval after."""
        self._advised = True
        self._advice.log(
            logging.WARNING,
            "Kafka refuses record %s of key %r (topic %r) for good: %s. To fix it: %s",
            rec.id, rec.key, rec.topic, cause, hint,
            cause=f"{rec.key!r} {cause.code}",
        )

    def settled(self, ids: Iterable[int]) -> None:
        """These records reached Kafka: their earlier failures no longer count."""
        if self._attempts:
            for rid in ids:
                self._attempts.pop(rid, None)
                self._first_poison.pop(rid, None)
        if self._advised and not self._blocked.count:
            self._advised = False
            # Nothing is held back any more: what is left to report of the advice now, and a
            # key that fails again later is advised in full afresh.
            self._advice.flush(forget=True)

    def quarantined(self, entries: Sequence[QuarantineEntry]) -> None:
        """The quarantine of these records is stored: count, log and report it."""
        self._metrics.records_quarantined += len(entries)
        self._blocked.settled([q.record.id for q in entries if q.record.id is not None], "was quarantined")
        for q in entries:
            if q.record.id is not None:
                self._attempts.pop(q.record.id, None)
                self._first_poison.pop(q.record.id, None)
            hint = quarantine_hint(q.error.split(":", 1)[0], q.record.topic, self._kafka_config)
            log.error(
                "quarantined key %r after %d failed attempts of record %s (topic %r): %s; "
                "the key is parked: its later records wait until it is replayed or discarded. %s",
                q.record.key,
                q.attempts,
                q.record.id,
                q.record.topic,
                q.error,
                hint[:1].upper() + hint[1:],
            )
            self._emit(RecordQuarantined(q.record.id, q.record.key, q.record.topic, q.error, q.attempts, hint))
