"""The inbox's Kafka consumer on confluent-kafka: :class:`~pyharvest.core.inbox.ports.InboxConsumer`.

Guarantee: offsets live in the inbox's database, never in Kafka. Kafka is told not to move
or store offsets itself; an assigned partition is sought to the offset the inbox's listener
read from the database (Kafka's committed offset is never consulted), and its messages are
delivered only from there, each offset once, and only until the partition is revoked, lost
or paused. Offsets committed to Kafka are for lag monitoring only.

Rebalance callbacks run inside ``consume()`` on the polling thread; they become plain calls
of the listener, and what the listener raises is raised by the :meth:`poll` that ran them
(librdkafka's callbacks are no place for an exception to unwind through).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, Consumer, KafkaError, KafkaException
from confluent_kafka import TopicPartition as KafkaTopicPartition

from pyharvest.bindings.kafka.librdkafka_logs import librdkafka_logger
from pyharvest.core.config.kafka_acls import Acl, is_authorization_failure, refused
from pyharvest.core.inbox.errors import InboxError, first_line
from pyharvest.core.inbox.message import InboxMessage, build_message, delivery_id_for, source_identity
from pyharvest.core.inbox.ports import RebalanceListener, TopicPartition

__all__ = ["ConfluentInboxConsumer", "inbox_consumer_config"]

log = logging.getLogger("pyharvest.inbox")

_LATEST = ("latest", "largest", "end")


def inbox_consumer_config(base: Mapping[str, object], group_id: str) -> dict[str, object]:
    """The consumer's configuration: ``base`` with the properties the inbox owns set."""
    conf: dict[str, object] = dict(base)
    conf.setdefault("auto.offset.reset", "earliest")
    conf.update(
        {
            "group.id": group_id,
            # Offsets live in the database; Kafka's are written for monitoring only.
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "logger": librdkafka_logger(),
        }
    )
    return conf


class ConfluentInboxConsumer:
    """A consumer group member; ``factory`` (for tests) builds the confluent-kafka consumer."""

    def __init__(
        self,
        base_config: Mapping[str, object],
        group_id: str,
        *,
        factory: Callable[[dict[str, object]], Any] | None = None,
    ) -> None:
        conf = inbox_consumer_config(base_config, group_id)
        self._base_config = base_config
        self._topics: list[str] = []
        self._group = group_id
        # Where a partition with no offset in the database starts.
        self._start_at_end = str(conf["auto.offset.reset"]).lower() in _LATEST
        self._consumer: Any = factory(conf) if factory is not None else Consumer(conf)
        self._closed = False
        self._listener: RebalanceListener | None = None
        # The partitions being delivered → the next offset to deliver (None: wherever Kafka
        # starts). Fetched messages outside it, or before it, are stale and dropped.
        self._position: dict[TopicPartition, int | None] = {}
        self._callback_error: BaseException | None = None

    def subscribe(self, topics: Sequence[str], listener: RebalanceListener) -> None:
        self._listener = listener
        self._topics = list(topics)
        self._consumer.subscribe(
            list(topics), on_assign=self._on_assign, on_revoke=self._on_revoke, on_lost=self._on_lost
        )

    def poll(self, max_messages: int, timeout: float) -> list[InboxMessage]:
        messages = self._consumer.consume(max_messages, timeout)
        if self._callback_error is not None:
            e, self._callback_error = self._callback_error, None
            raise e
        out: list[InboxMessage] = []
        group = self._group
        position = self._position
        for m in messages:
            err = m.error()
            if err is not None:
                if is_authorization_failure(err.name() or ""):
                    raise self._refused(err, m.topic())
                if err.fatal():
                    raise InboxError(f"fatal Kafka consumer error: {err}")
                if err.code() != KafkaError._PARTITION_EOF:
                    log.warning("Kafka consumer error (retried): %s", err)
                continue
            topic, partition, offset = m.topic(), m.partition(), m.offset()
            tp = (topic, partition)
            if tp not in position:
                continue
            pos = position[tp]
            if pos is not None and offset < pos:
                continue
            position[tp] = offset + 1
            raw = m.headers()
            headers = tuple(raw) if raw else ()
            source = source_identity(headers) if headers else None
            ts_type, ts = m.timestamp()
            out.append(
                build_message(
                    topic,
                    partition,
                    offset,
                    m.key(),
                    m.value(),
                    headers,
                    ts if ts_type else None,
                    source,
                    delivery_id_for(group, topic, partition, offset, source),
                )
            )
        return out

    def _refused(self, err: Any, topic: str | None) -> Exception:
        """An ACL refused the group or a topic: no retry will get through."""
        if err.code() == KafkaError.GROUP_AUTHORIZATION_FAILED:
            acl = Acl("group", self._group, ("Read",), "joining the inbox's group")
        else:
            acl = Acl("topic", topic or ",".join(self._topics), ("Read",), "consuming the messages the inbox applies")
        return refused(self._base_config, acl, err.str())

    def pause(self, partitions: list[TopicPartition]) -> None:
        for tp in partitions:
            self._position.pop(tp, None)
        if partitions and not self._closed:
            try:
                self._consumer.pause([KafkaTopicPartition(t, p) for t, p in partitions])
            except KafkaException as e:  # not assigned any more: nothing to pause
                log.debug("pausing %s: %s", partitions, e)

    def commit(self, positions: Mapping[TopicPartition, int]) -> None:
        if self._closed:
            return
        try:
            self._consumer.commit(
                offsets=[KafkaTopicPartition(t, p, o) for (t, p), o in positions.items()], asynchronous=True
            )
        except KafkaException as e:  # monitoring only: never worth failing a batch for
            log.debug("Kafka offset commit (monitoring only) failed: %s", e)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._consumer.close()  # leaves the group; a last revocation may run inside
        except Exception as e:  # noqa: BLE001
            log.debug("closing the consumer: %s", e)
        self._position.clear()

    # ------------------------------------------------------------------ rebalance callbacks

    def _on_assign(self, consumer: Any, partitions: list[Any]) -> None:
        assert self._listener is not None  # subscribe() set it before any rebalance
        try:
            starts = self._listener.assigned([(p.topic, p.partition) for p in partitions])
            for p in partitions:
                tp = (p.topic, p.partition)
                start = starts[tp]
                self._position[tp] = start
                if start is not None:
                    p.offset = start
                else:
                    p.offset = OFFSET_END if self._start_at_end else OFFSET_BEGINNING
            consumer.assign(partitions)
            if partitions:
                consumer.resume(partitions)  # paused when an earlier claim's fence moved
                log.info(
                    "assigned %s",
                    ", ".join(f"{p.topic}[{p.partition}]@{'start' if p.offset < 0 else p.offset}" for p in partitions),
                )
        except BaseException as e:  # noqa: BLE001 - raised by poll(), on the polling thread
            # Fatal, never "retry": partitions we could not claim must not be consumed at all.
            error = InboxError(f"cannot take partitions over: {type(e).__name__}: {first_line(e)}")
            error.__cause__ = e
            self._callback_error = error

    def _on_revoke(self, _consumer: Any, partitions: list[Any]) -> None:
        assert self._listener is not None  # subscribe() set it before any rebalance
        self._hand_over(self._listener.revoked, partitions)

    def _on_lost(self, _consumer: Any, partitions: list[Any]) -> None:
        assert self._listener is not None
        self._hand_over(self._listener.lost, partitions)

    def _hand_over(self, notify: Callable[[list[TopicPartition]], None], partitions: list[Any]) -> None:
        tps = [(p.topic, p.partition) for p in partitions]
        try:
            notify(tps)
        except BaseException as e:  # noqa: BLE001 - raised by poll(), on the polling thread
            self._callback_error = e
            return
        for tp in tps:
            self._position.pop(tp, None)
