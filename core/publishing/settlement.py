"""The middle both delivery modes share: settling records in the database once Kafka has
answered for them, and judging the failures.

A mode differs only in how a batch goes out (producer callbacks, or a Kafka transaction); once
Kafka has answered, both do the same here: purge what was delivered, reset or quarantine what
failed (retrying each statement until it succeeds or may no longer be tried), judge failures by
the poison policy, keep the keys such failures hold back (:mod:`~pyharvest.core.publishing.blocked_keys`),
and pause longer after each batch with a record Kafka refused for good, for as long as one is
still retried.

A settlement is never skipped while it may be retried: releasing a key before its rows are
settled would break per-key order.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

from pyharvest.core.config.choices import PoisonPolicy
from pyharvest.core.config.settings import Config
from pyharvest.core.outbox.records import OutboxRecord
from pyharvest.core.ports.database import DatabaseBinding, QuarantineBinding, QuarantineEntry
from pyharvest.core.ports.kafka import DeliveryError
from pyharvest.core.publishing.blocked_keys import BlockedKeys
from pyharvest.core.publishing.failures import FailedAttempts, Verdicts
from pyharvest.core.telemetry.events import Event
from pyharvest.core.telemetry.logs import log, one_line
from pyharvest.core.telemetry.metrics import HarvestMetrics
from pyharvest.core.telemetry.spans import BatchSpans

__all__ = ["MAX_POISON_BACKOFF", "Patience", "Settlement"]

T = TypeVar("T")

# The longest pause before a record Kafka refused for good is tried again.
MAX_POISON_BACKOFF = 10.0


class Patience(Protocol):
    """How long a mode keeps retrying a failed statement: the at-least-once delivery thread
    until the shutdown deadline; the exactly-once publisher while it also still leads."""

    def may_retry(self) -> bool: ...

    def pause(self) -> None:
        """Wait before the next attempt."""
        ...


class Settlement:
    """Purges, resets and quarantines in the database, with their metrics and spans, and the
    failures' verdicts; one per engine, used from its delivery thread alone."""

    def __init__(
        self,
        config: Config,
        metrics: HarvestMetrics,
        spans: BatchSpans,
        emit: Callable[[Event], None],
        patience: Patience,
        *,
        blocked: BlockedKeys | None = None,
    ) -> None:
        self._config = config
        self._metrics = metrics
        self._spans = spans
        self._patience = patience
        #: The keys held back by records Kafka refused for good, while they are retried.
        self.blocked = blocked if blocked is not None else BlockedKeys()
        self._failures = FailedAttempts(config, metrics, emit, self.blocked)
        self._backoff = config.limits.io_error_backoff or 0.01
        #: Consecutive batches with a record Kafka refused for good: the retry's pause grows with it.
        self.poison_streak = 0
        # A pause is owed once per batch with such a record: a remark for another cause (a
        # failed mark, a queue timeout) does not wait for it.
        self._backoff_due = False

    # ------------------------------------------------------------------ verdicts

    def judge(self, binding: DatabaseBinding, failures: Sequence[tuple[OutboxRecord, DeliveryError]]) -> Verdicts:
        """Count each failure and decide: retry, or quarantine (``poisonPolicy: quarantine``,
        where the binding stores a quarantine). Counts the poison streak too."""
        # Read at each failure, not once: the policy may be set after construction.
        quarantine_on = self._config.poison_policy == PoisonPolicy.QUARANTINE and isinstance(binding, QuarantineBinding)
        if not self.blocked.count:
            self.poison_streak = 0  # none retried since the last: a new poison record starts from the bottom
        verdicts = self._failures.judge(failures, quarantine_on)
        if verdicts.poison:
            self.poison_streak += 1
            self._backoff_due = True
        return verdicts

    def clean(self) -> None:
        """A batch went out with no record refused for good: the poison pause starts afresh."""
        self.poison_streak = 0

    def poison_backoff(self) -> float:
        """How long to pause before retrying a record Kafka refused for good: 0 unless a
        batch since the last call had one, and 0 once none is retried any more (delivered,
        quarantined, or its row gone), when the streak starts afresh."""
        due, self._backoff_due = self._backoff_due, False
        if not self.blocked.count:
            self.poison_streak = 0
            return 0.0
        streak = self.poison_streak
        return min(MAX_POISON_BACKOFF, self._backoff * 2 ** min(streak - 1, 10)) if streak and due else 0.0

    def delivered(self, ids: Sequence[int]) -> None:
        """These records reached Kafka: their earlier failures no longer count."""
        self._failures.settled(ids)
        if self.blocked.count:
            self.blocked.settled(ids, "went through")

    # ------------------------------------------------------------------ statements

    def purge(self, binding: DatabaseBinding, ids: list[int], what: str, giving_up: str) -> int | None:
        """Purge ``ids`` (retried while :class:`Patience` allows); the rows purged, or None if
        given up (the log line says ``giving_up``: who purges them instead)."""
        metrics = self._metrics
        started = time.monotonic()
        with self._spans.purge(len(ids)):
            purged = self._retried(f"purge of {what}" if what else "purge", binding.purge, ids, giving_up)
        metrics.observe(metrics.purge_seconds, time.monotonic() - started)
        if purged is not None:
            metrics.purge_statements += 1
            metrics.records_purged += purged
        return purged

    def reset(self, binding: DatabaseBinding, records: Sequence[OutboxRecord]) -> None:
        """Unmark failed records for a remark. Each reset names the leader id the rows were
        marked under: a late reset must not unmark a row that a newer leader has marked since."""
        by_leader: dict[str | None, list[Any]] = {}
        for rec in records:
            by_leader.setdefault(rec.leader_id, []).append(rec.id)
        for leader_id, ids in by_leader.items():
            # B023 does not apply: the lambda runs within this iteration, seeing this iteration's leader_id.
            op = lambda i: binding.reset(i, leader_id)  # noqa: E731, B023
            reset = self._retried("reset", op, ids, "at shutdown; the next leader remarks them")
            if reset is not None:
                self._metrics.reset_statements += 1
                self._metrics.records_reset += reset

    def quarantine(self, binding: DatabaseBinding, entries: list[QuarantineEntry], giving_up: str) -> bool:
        """Store the quarantine of these records; whether it was stored."""
        assert isinstance(binding, QuarantineBinding)  # judge() quarantines only where it can be stored
        if self._retried("quarantine", binding.quarantine, entries, giving_up) is None:
            return False
        self._failures.quarantined(entries)
        return True

    def _retried(self, what: str, op: Callable[[list[Any]], T], items: list[Any], giving_up: str) -> T | None:
        """``op(items)``, retried after a pause until it succeeds; None once :class:`Patience`
        says no more."""
        patience = self._patience
        attempt = 0
        while True:
            try:
                return op(items)
            except Exception as e:  # noqa: BLE001 - a database error: retried
                attempt += 1
                self._metrics.db_errors += 1
                if not patience.may_retry():
                    log.error("giving up on %s of %d records (%s): %s", what, len(items), giving_up, one_line(e))
                    return None
                if attempt == 1 or attempt % 20 == 0:
                    log.warning(
                        "%s of %d records failed (attempt %d), retrying: %s", what, len(items), attempt, one_line(e)
                    )
                patience.pause()
