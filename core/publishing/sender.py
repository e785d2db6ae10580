"""The send step: the data producer, its settings, and how a record becomes a message.

Every record handed to :meth:`Sender.send` yields exactly one delivery report, even when the
producer refuses the message outright: the per-key gate lifts a key's barrier only on its
record's report, so a record never reported would hold its key until the next remark.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence

from pyharvest.core.config.settings import Config
from pyharvest.core.outbox.identity import IdentityStamp
from pyharvest.core.outbox.records import OutboxRecord
from pyharvest.core.ports.kafka import DeliveryError, KafkaClients, ProduceError, Producer
from pyharvest.core.telemetry.logs import log, one_line
from pyharvest.core.telemetry.metrics import HarvestMetrics
from pyharvest.core.telemetry.spans import BatchSpans

__all__ = ["DEFAULT_DELIVERY_TIMEOUT_MS", "DEFAULT_LINGER_MS", "Flight", "Sender", "producer_config"]

# A delivery.timeout.ms of 5 minutes (librdkafka's default) would stall a remark for that long
# when the broker is unreachable; a leader must learn the fate of its in-flight records sooner.
DEFAULT_DELIVERY_TIMEOUT_MS = 10_000

# A key's next record waits for the previous one's ack and purge, so a hot key's rate is one
# record per linger + round trip + purge. librdkafka's 5 ms default halved the rate of hot
# keys; 1 ms costs a drain nothing measurable (broker batches stay full under a backlog).
DEFAULT_LINGER_MS = 1


def producer_config(config: Config) -> dict[str, object]:
    cfg: dict[str, object] = {**config.base_kafka_config, **config.producer_kafka_config}
    # Idempotence keeps librdkafka's internal retries from reordering or duplicating a partition.
    cfg["enable.idempotence"] = True
    if "delivery.timeout.ms" not in cfg and "message.timeout.ms" not in cfg:
        cfg["delivery.timeout.ms"] = DEFAULT_DELIVERY_TIMEOUT_MS
    if "linger.ms" not in cfg and "queue.buffering.max.ms" not in cfg:
        cfg["linger.ms"] = DEFAULT_LINGER_MS
    return cfg


class Flight:
    """One sent record; called once with its delivery outcome, which it appends to its sender's
    :attr:`Sender.reports`."""

    __slots__ = ("_sink", "error", "record")

    def __init__(self, record: OutboxRecord, sink: Callable[[Flight], None]) -> None:
        self.record = record
        self.error: DeliveryError | None = None
        self._sink = sink

    def __call__(self, error: DeliveryError | None) -> None:
        self.error = error
        self._sink(self)


class Sender:
    """Owns the data producer from :meth:`open` to :meth:`detach`; each record's outcome lands
    in :attr:`reports`, which the delivery thread settles."""

    def __init__(
        self, config: Config, kafka: KafkaClients, metrics: HarvestMetrics, spans: BatchSpans, stamp: IdentityStamp
    ) -> None:
        self._config = config
        self._spans = spans
        self._kafka = kafka
        self._metrics = metrics
        self._stamp = stamp
        #: Outcomes not yet settled, appended by each :class:`Flight` from the producer's poll.
        self.reports: deque[Flight] = deque()
        #: ``None`` before :meth:`open` and after :meth:`detach`; the delivery thread polls it.
        self.producer: Producer | None = None

    def open(self) -> None:
        self.producer = self._kafka.producer(producer_config(self._config))

    def send(self, records: Sequence[OutboxRecord]) -> None:
        producer = self.producer
        assert producer is not None
        sink = self.reports.append
        headers = self._stamp.headers
        with self._spans.publish(records):  # the batch handed to the producer: one span
            for rec in records:
                flight = Flight(rec, sink)
                try:
                    producer.produce(rec.topic, rec.key, rec.value, headers(rec), flight)
                except ProduceError as e:
                    flight(e.error)
                except Exception as e:  # noqa: BLE001 - treated as a failed delivery: reset and remark
                    flight(DeliveryError("PRODUCE", one_line(e)))
        self._metrics.records_published += len(records)

    def replace(self) -> None:
        """A fatal producer error (say, fenced after an epoch bump) fails every later message:
        start afresh with a new producer. Called with nothing in flight."""
        old = self.producer
        log.warning("the producer hit a fatal error; replacing it")
        self.producer = self._kafka.producer(producer_config(self._config))
        if old is not None:
            try:
                old.close()
            except Exception as e:  # noqa: BLE001 - it is being discarded anyway
                log.debug("closing the broken producer: %s", one_line(e))

    def abandon(self) -> None:
        """The leader was fenced: nothing it handed to the producer may reach Kafka from now
        on (see :meth:`~pyharvest.core.ports.kafka.Producer.abandon`); the failed reports reset the
        rows, which its successor will have remarked anyway."""
        producer = self.producer
        if producer is not None:
            producer.abandon()

    def detach(self) -> Producer | None:
        """Take the producer away for closing; the delivery thread stops at its next turn."""
        producer, self.producer = self.producer, None
        return producer
