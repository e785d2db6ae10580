"""What both publish paths do with failures: count a record's failed attempts and decide
whether it is quarantined (:class:`FailedAttempts`), and retry a database settlement (purge,
reset, quarantine) until it succeeds or may no longer be tried (:func:`settle`).

The at-least-once delivery thread (:mod:`pyharvest.core.delivery.processor`) and the exactly-once
publisher (:mod:`pyharvest.core.transactions.publisher`) differ in what they do with the verdicts (reset
and remark, or hold a key out of the next transactions), not in the verdicts themselves.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from pyharvest.core.config.settings import Config
from pyharvest.core.delivery.poison_hints import poison_hint, quarantine_hint
from pyharvest.core.outbox.records import OutboxRecord
from pyharvest.core.ports.database import QuarantineEntry
from pyharvest.core.ports.kafka import DeliveryError
from pyharvest.core.telemetry.events import DeliveryFailed, Event, RecordQuarantined
from pyharvest.core.telemetry.logs import log, one_line
from pyharvest.core.telemetry.metrics import HarvestMetrics

__all__ = ["FailedAttempts", "Verdicts", "before", "settle"]

T = TypeVar("T")


@dataclass(slots=True)
class Verdicts:
    """What a batch of failures comes to: the positions of the failures to retry, the records
    to quarantine, how many were poison (refused for good), the first poison record's hint,
    and whether the producer is broken (a fatal error)."""

    retry: list[int] = field(default_factory=list)
    quarantine: list[QuarantineEntry] = field(default_factory=list)
    poison: int = 0
    first_hint: str = ""
    fatal: bool = False


class FailedAttempts:
    """Failed attempts per record id (only records that failed appear), the poison policy's
    verdicts, and the events and metrics of each failure and quarantine."""

    def __init__(self, config: Config, metrics: HarvestMetrics, emit: Callable[[Event], None]) -> None:
        self._config = config
        self._metrics = metrics
        self._emit = emit
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
                verdicts.first_hint = verdicts.first_hint or hint
            verdicts.fatal = verdicts.fatal or err.fatal
            self._emit(DeliveryFailed(rec.id, rec.key, rec.topic, str(err), err.retriable, attempts, hint))
            if quarantine_on and not err.retriable and attempts >= max_attempts:
                verdicts.quarantine.append(QuarantineEntry(rec, str(cause), attempts))
            else:
                verdicts.retry.append(i)
        return verdicts

    def settled(self, ids: Iterable[int]) -> None:
        """These records reached Kafka: their earlier failures no longer count."""
        if self._attempts:
            for rid in ids:
                self._attempts.pop(rid, None)
                self._first_poison.pop(rid, None)

    def quarantined(self, entries: Sequence[QuarantineEntry]) -> None:
        """The quarantine of these records is stored: count, log and report it."""
        self._metrics.records_quarantined += len(entries)
        for q in entries:
            if q.record.id is not None:
                self._attempts.pop(q.record.id, None)
                self._first_poison.pop(q.record.id, None)
            hint = quarantine_hint(q.error.split(":", 1)[0], q.record.topic, self._kafka_config)
            log.error(
                "quarantined key %r after %d failed attempts of record %s (topic %r): %s; "
                "its later records are held back until the key is replayed or discarded. %s",
                q.record.key,
                q.attempts,
                q.record.id,
                q.record.topic,
                q.error,
                hint[:1].upper() + hint[1:],
            )
            self._emit(RecordQuarantined(q.record.id, q.record.key, q.record.topic, q.error, q.attempts, hint))


def settle(
    what: str,
    op: Callable[[list[Any]], T],
    items: list[Any],
    *,
    metrics: HarvestMetrics,
    pause: Callable[[], object],
    may_retry: Callable[[], bool],
    giving_up: str,
) -> T | None:
    """``op(items)``, retried after ``pause()`` until it succeeds; ``None`` once ``may_retry()``
    says no more (the log line then says ``giving_up``: who settles the rows instead). A
    settlement is never skipped while it may be retried: releasing a key before its rows are
    settled would break per-key order."""
    attempt = 0
    while True:
        try:
            return op(items)
        except Exception as e:  # noqa: BLE001 - a database error: retried
            attempt += 1
            metrics.db_errors += 1
            if not may_retry():
                log.error("giving up on %s of %d records (%s): %s", what, len(items), giving_up, one_line(e))
                return None
            if attempt == 1 or attempt % 20 == 0:
                log.warning(
                    "%s of %d records failed (attempt %d), retrying: %s", what, len(items), attempt, one_line(e)
                )
            pause()


def before(deadline: Callable[[], float | None]) -> Callable[[], bool]:
    """A ``may_retry`` that says yes until ``deadline()`` (None: no deadline) has passed."""

    def may_retry() -> bool:
        at = deadline()
        return at is None or time.monotonic() <= at

    return may_retry
