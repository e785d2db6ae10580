"""confluent-kafka's transactions behind the engine's exactly-once protocols
(:class:`~pyharvest.core.ports.kafka.TransactionalProducer`, the progress topic's read and creation)."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Sequence

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition
from confluent_kafka.admin import NewPartitions, NewTopic  # type: ignore[attr-defined]

from pyharvest.bindings.kafka.admin import admin_client as _admin
from pyharvest.bindings.kafka.admin import client_config as _client_config
from pyharvest.bindings.kafka.admin import metadata_within, refused_configuration
from pyharvest.bindings.kafka.cluster_probes import partitions_probe
from pyharvest.bindings.kafka.confluent import FENCING_CODES, ConfluentClients, ConfluentProducer
from pyharvest.core.config.kafka_acls import Acl, is_authorization_failure, refused
from pyharvest.core.errors import KafkaAuthorizationError
from pyharvest.core.healing.stuck_clients import ProgressWatch
from pyharvest.core.ports.kafka import DeliveryCallback, KafkaConfigMap, ProduceError, TopicError, TransactionError

__all__ = [
    "ConfluentTransactionalClients",
    "ConfluentTransactionalProducer",
    "ensure_progress_topic",
    "last_committed",
    "probe_transactions",
]

log = logging.getLogger("pyharvest.kafka")

# What a cluster without transactions answers (an old broker, or a development broker).
_UNSUPPORTED = frozenset(
    c
    for c in (
        getattr(KafkaError, n, None)
        for n in ("UNSUPPORTED_VERSION", "_UNSUPPORTED_FEATURE")
    )
    if c is not None
)

# Records read back per step when looking for a partition's last committed record: each
# transaction leaves one progress record and one commit marker in it.
_WINDOW = 64


def transaction_error(e: KafkaException) -> TransactionError:
    err = e.args[0] if e.args and isinstance(e.args[0], KafkaError) else None
    if err is None:
        return TransactionError("fatal", str(e))
    text = f"{err.name()}: {err.str()}"
    if err.code() in FENCING_CODES:
        return TransactionError("fenced", text)
    if err.code() in _UNSUPPORTED:
        return TransactionError("unsupported", text)
    if err.fatal():
        return TransactionError("fatal", text)
    if err.txn_requires_abort():
        return TransactionError("abortable", text)
    if err.retriable():
        return TransactionError("retriable", text)
    return TransactionError("fatal", text)


def transactional_id_acl(config: KafkaConfigMap) -> Acl:
    """The ACL a producer of ``config`` needs for its ``transactional.id``: ``Write`` on every
    id of its group (``pyharvest.<leaderGroupID>.``: what follows the last dot is the shard, or
    the start-up probe's own id)."""
    tid = str(config.get("transactional.id", ""))
    return Acl("transactional-id", tid.rsplit(".", 1)[0] + ".", ("Write",),
               "publishing in Kafka transactions (delivery: exactly-once)", prefixed=True)


def _refusal(error: KafkaException) -> KafkaError | None:
    err = error.args[0] if error.args and isinstance(error.args[0], KafkaError) else None
    return err if err is not None and is_authorization_failure(err.name() or "") else None


class ConfluentTransactionalProducer(ConfluentProducer):
    """A producer with a ``transactional.id``. Only the thread running its transactions
    produces and polls it: no other thread serves its delivery reports. An ACL's refusal of
    the id is a :class:`~pyharvest.core.errors.KafkaAuthorizationError` naming it.

    With ``heal_after`` (seconds), a producer whose transactions kept failing for that long,
    none committed, while the leaders of the partitions it failed to write answer a fresh
    client, refuses the next :meth:`begin_transaction` with a fatal :class:`TransactionError`:
    the engine gives it up and takes over afresh with a new producer, as after any fatal error
    (:mod:`pyharvest.core.healing.stuck_clients`)."""

    def __init__(self, config: KafkaConfigMap, heal_after: float | None = None) -> None:
        super().__init__(config)  # not healed as a producer: the engine replaces this one
        self._transactions_watch = None if heal_after is None else ProgressWatch(
            "transactional_producer", heal_after, partitions_probe(config, lambda: tuple(self._unanswered))
        )
        #: Whether the last transaction committed (or none began yet): the clock runs only
        #: across transactions that did not, never while the outbox is idle.
        self._committed = True

    def produce(
        self,
        topic: str,
        key: str,
        value: bytes | str | None,
        headers: Sequence[tuple[str, str | bytes]],
        on_delivery: DeliveryCallback,
        partition: int | None = None,
    ) -> None:
        try:
            super().produce(topic, key, value, headers, on_delivery, partition)
        except ProduceError as e:
            if e.error.fatal:
                raise TransactionError("fenced" if e.error.fenced else "fatal", str(e)) from None
            raise

    def flush(self, timeout: float) -> int:
        try:
            return super().flush(timeout)
        except SystemError as e:
            # confluent-kafka lost a callback's exception inside the flush's dispatch ("returned
            # NULL without setting an exception"; see bindings.kafka.confluent._callback_failed):
            # a delivery report may have been dropped with it, so this transaction's outcome is
            # unknown. Counted as left over, it is aborted and its records remarked.
            log.warning("the producer's flush failed inside confluent-kafka (%s): the transaction is aborted and "
                        "its records remarked", e)
            return max(1, len(self._producer))

    def init_transactions(self, timeout: float) -> None:
        # A producer that has no broker connection yet when it asks for its producer id waits
        # for a retry timer (seen: 0.5 s of a takeover); a metadata request connects it first.
        try:
            self._producer.list_topics(timeout=timeout)
        except KafkaException as e:
            raise transaction_error(e) from None
        self._call("init_transactions", timeout)

    def refused(self, err: KafkaError) -> KafkaAuthorizationError:
        return refused(self._config, transactional_id_acl(self._config), err.str())

    def begin_transaction(self) -> None:
        watch = self._transactions_watch
        if watch is not None:
            if self._committed:
                watch.progressed()
            elif watch.stuck():
                watch.replaced("its transactions kept failing")
                raise TransactionError("fatal", f"no transaction committed for {watch.after:.0f}s while the cluster "
                                                "answers a fresh client: replacing the producer")
            self._committed = False
        self._call("begin_transaction")

    def commit_transaction(self, timeout: float) -> None:
        self._call("commit_transaction", timeout)
        self._committed = True

    def abort_transaction(self, timeout: float) -> None:
        self._call("abort_transaction", timeout)

    def _call(self, name: str, *args: float) -> None:
        try:
            getattr(self._producer, name)(*args)
        except KafkaException as e:
            err = _refusal(e)
            if err is not None and err.code() == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED:
                raise self.refused(err) from None
            raise transaction_error(e) from None


def ensure_progress_topic(config: KafkaConfigMap, topic: str, partitions: int, timeout: float = 10.0) -> None:
    """Create the progress topic (compacted: only each shard's latest record matters, and it
    must outlive any retention) or check that it has a partition per shard."""
    errors: list[KafkaError] = []
    admin = _admin(config, errors=errors)
    metadata = metadata_within(config, admin, errors, timeout)
    found = metadata.topics.get(topic)
    if found is not None and found.error is None:
        have = len(found.partitions)
        if have >= partitions:
            return
        # A shard's progress lives in its own partition, found by number: adding partitions
        # moves nothing that is already there.
        futures = admin.create_partitions([NewPartitions(topic, partitions)], operation_timeout=timeout)
        try:
            futures[topic].result(timeout)
        except KafkaException as e:
            raise TopicError(
                f"progress topic {topic!r} has {have} partition(s) and {partitions} shards need as many; "
                f"adding them failed ({e.args[0].str()})"
            ) from None
        log.info("added partitions to progress topic %r: %d -> %d", topic, have, partitions)
        return
    new = NewTopic(topic, partitions, config={"cleanup.policy": "compact"})
    futures = admin.create_topics([new], operation_timeout=timeout)
    try:
        futures[topic].result(timeout)
    except KafkaException as e:
        err = e.args[0]
        if err.code() == KafkaError.TOPIC_ALREADY_EXISTS:
            return
        if is_authorization_failure(err.name() or ""):
            why = (f"creating the progress topic: it does not exist (or Read, which shows it, is missing); or create "
                   f"it beforehand, compacted, with {partitions} partition(s)")
            raise refused(config, Acl("topic", topic, ("Create",), why), err.str()) from None
        raise TopicError(
            f"progress topic {topic!r} does not exist and could not be created ({err.str()}); create it "
            f"compacted (cleanup.policy=compact) with {partitions} partition(s), or grant the harvester CREATE"
        ) from None
    log.info("created progress topic %r with %d partition(s)", topic, partitions)


# Properties of the harvester's clients that a reader of committed records must not take.
_NOT_FOR_THE_READER = (
    "group.",
    "enable.auto",
    "auto.offset",
    "isolation",
    "transaction",
    "enable.idempotence",
    "delivery.timeout",
    "message.timeout",
    "linger",
    "queue.buffering",
)


def _committed_reader(config: KafkaConfigMap, purpose: str) -> Consumer:
    """A ``read_committed`` consumer with ``config``'s connection settings, for partitions it
    assigns itself (it never joins its group)."""
    cfg = {k: v for k, v in config.items() if not k.startswith(_NOT_FOR_THE_READER)}
    cfg.update(
        {
            "group.id": f"pyharvest-{purpose}-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "isolation.level": "read_committed",
            # At the end of the partition the broker holds a fetch this long for more data
            # (500 ms by default), and a takeover would wait for it.
            "fetch.wait.max.ms": 10,
        }
    )
    try:
        return Consumer(_client_config(cfg))
    except KafkaException as e:
        raise refused_configuration("consumer", e) from None


def last_committed(config: KafkaConfigMap, topic: str, partition: int, timeout: float) -> bytes | None:
    """The value of the last record a committed transaction wrote to ``partition``.

    Read backwards in windows from the end: aborted records and commit markers take offsets
    but are never delivered to a ``read_committed`` consumer, and compaction leaves gaps.
    Called after ``init_transactions``, so no transaction of this shard is open and the
    partition's end is stable."""
    consumer = _committed_reader(config, "progress")
    deadline = time.monotonic() + timeout
    try:
        try:
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=timeout, cached=False)
        except KafkaException as e:
            err = _refusal(e)
            if err is not None:
                raise _read_refused(config, topic, err) from None
            raise TopicError(f"cannot read the offsets of {topic!r} partition {partition}: {e.args[0].str()}") from None
        end, step = high, _WINDOW
        while end > low:
            start = max(low, end - step)
            found = _last_value(consumer, TopicPartition(topic, partition, start), end, deadline, config)
            if found is not None:
                return found
            end, step = start, step * 4
        return None
    finally:
        consumer.close()


def _read_refused(config: KafkaConfigMap, topic: str, err: KafkaError) -> KafkaAuthorizationError:
    return refused(config, Acl("topic", topic, ("Read",), "reading progress records back"), err.str())


def _last_value(
    consumer: Consumer, tp: TopicPartition, end: int, deadline: float, config: KafkaConfigMap
) -> bytes | None:
    """The last committed value in offsets [tp.offset, end), reading up to the partition's end."""
    consumer.assign([tp])
    last: bytes | None = None
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TopicError(f"timed out reading progress topic {tp.topic!r} partition {tp.partition}")
        msg = consumer.poll(min(remaining, 1.0))
        if msg is None:
            continue
        err = msg.error()
        if err is not None:
            if err.code() == KafkaError._PARTITION_EOF:
                return last
            if err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED:
                raise _read_refused(config, tp.topic, err)
            if err.fatal() or err.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
                raise TopicError(f"cannot read progress topic {tp.topic!r}: {err.str()}")
            log.debug("progress reader: %s", err.str())
            continue
        offset = msg.offset()
        if offset is not None and offset >= end:
            return last
        value = msg.value()
        if value is not None:
            last = value if isinstance(value, bytes) else str(value).encode()


def probe_transactions(config: KafkaConfigMap, topic: str, partition: int, timeout: float) -> None:
    """Abort a transaction of one record in ``topic`` and check that a ``read_committed``
    consumer does not see it. A broker may accept every transactional request and still
    show aborted records (the embedded development broker does): exactly-once would then
    publish duplicates without a word. ``config`` is a producer's, with its ``transactional.id``."""
    producer = ConfluentTransactionalProducer(config)
    offsets: list[int] = []
    refusals: list[KafkaError] = []

    def delivered(err: KafkaError | None, msg: Message) -> None:
        offset = msg.offset()
        if err is None and offset is not None:
            offsets.append(offset)
        elif err is not None and is_authorization_failure(err.name() or ""):
            refusals.append(err)

    try:
        producer.init_transactions(timeout)
        producer.begin_transaction()
        raw = producer._producer
        raw.produce(topic, b"", b"pyharvest-probe", partition, on_delivery=delivered)
        raw.flush(timeout)
        if not offsets and not refusals:
            # A partition the principal may not write fails the transaction, and the record is
            # only purged: the cause comes back from a commit (which commits nothing of a
            # failed transaction).
            try:
                raw.commit_transaction(timeout)
            except KafkaException as e:
                refusals.extend(err for err in (_refusal(e),) if err is not None)
        if not refusals:
            producer.abort_transaction(timeout)
    except TransactionError as e:
        if not refusals:
            raise
        log.debug("the probe's transaction: %s", e)
    finally:
        producer.close()
    if refusals:
        acl = Acl("topic", topic, ("Write",), "writing progress records (the probe's included)")
        raise refused(config, acl, refusals[0].str())
    if not offsets:
        raise TransactionError("unsupported", "the probe record of an aborted transaction was not acknowledged")
    consumer = _committed_reader(config, "probe")
    try:
        consumer.assign([TopicPartition(topic, partition, offsets[0])])
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            err = msg.error()
            if err is not None and err.code() == KafkaError._PARTITION_EOF:
                return
            if err is not None and err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED:
                raise _read_refused(config, topic, err)
            if err is None and msg.offset() == offsets[0]:
                raise TransactionError(
                    "unsupported", "it showed an aborted record to a read_committed consumer (no transaction isolation)"
                )
        raise TransactionError("unsupported", "reading back the probe of an aborted transaction timed out")
    finally:
        consumer.close()


class ConfluentTransactionalClients(ConfluentClients):
    """:class:`~pyharvest.bindings.kafka.confluent.ConfluentClients` that can also publish
    exactly once (:class:`~pyharvest.core.ports.kafka.TransactionalKafkaClients`): what
    :class:`pyharvest.Harvest` uses."""

    def transactional_producer(self, config: KafkaConfigMap) -> ConfluentTransactionalProducer:
        return ConfluentTransactionalProducer(config, self.heal_after)

    def ensure_progress_topic(self, config: KafkaConfigMap, topic: str, partitions: int, timeout: float = 10.0) -> None:
        ensure_progress_topic(config, topic, partitions, timeout)

    def probe_transactions(self, config: KafkaConfigMap, topic: str, partition: int, timeout: float) -> None:
        probe_transactions(config, topic, partition, timeout)

    def last_committed(self, config: KafkaConfigMap, topic: str, partition: int, timeout: float) -> bytes | None:
        return last_committed(config, topic, partition, timeout)
