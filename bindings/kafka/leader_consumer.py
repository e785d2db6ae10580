"""The leader group's consumer over confluent-kafka (:class:`~pyharvest.core.ports.kafka.LeaderConsumer`),
which replaces its librdkafka consumer when that one is stuck outside the group."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from pyharvest.bindings.kafka.admin import client_config, refused_configuration
from pyharvest.bindings.kafka.probes import group_probe
from pyharvest.core.config.kafka_acls import Acl, is_authorization_failure, refused
from pyharvest.core.ports.kafka import KafkaConfigMap
from pyharvest.core.ports.stuck_clients import ProgressWatch

__all__ = ["ConfluentLeaderConsumer"]

log = logging.getLogger("pyharvest.kafka")

_NO_CALLBACK: Callable[[list[int]], None] = lambda partitions: None  # noqa: E731


class ConfluentLeaderConsumer:
    """A member of the leader group.

    With ``heal_after`` (seconds), a librdkafka consumer that has not been a steady member of
    the group for that long, while the group's coordinator describes the group to a fresh
    client, is closed and replaced by a new one, which joins afresh (seen: after the broker
    froze and reloaded its group coordinator, librdkafka's consumer sometimes never rejoined).
    The partitions the old one held are revoked first, inside :meth:`poll`, as a rebalance
    would; the old one is closed on a thread of its own (a stuck client may not close at once),
    and nothing it still reports reaches the callbacks."""

    def __init__(
        self, config: KafkaConfigMap, heartbeat_timeout_ms: int | None = None, heal_after: float | None = None
    ) -> None:
        cfg = client_config(config)
        # librdkafka's statistics say whether any broker connection is up (the readiness signal;
        # the consumer protocol's statistics list the brokers alike) and whether the consumer is
        # a steady member of its group (the heal's progress).
        cfg.setdefault("statistics.interval.ms", 1000)
        cfg["error_cb"] = self._on_error
        self._cfg = cfg
        self._config = config
        self._refusal: KafkaError | None = None  # an ACL's refusal seen by error_cb, raised by poll
        self.connected: bool | None = None
        #: How many brokers the consumer knows, learned or bootstrap (its last statistics): none
        #: after metadata answers without brokers, until librdkafka bootstraps again (at once the
        #: first time, then only after ``metadata.recovery.rebootstrap.trigger.ms``, 5 minutes).
        self.known_brokers: int | None = None
        # A connection that is up but has not answered a waiting request for this long counts
        # as down: a frozen or overloaded broker keeps its sockets open, and librdkafka only
        # times the requests out after socket.timeout.ms (60 s). This is the heartbeat timeout
        # that fences a leader: given under the consumer protocol, else a third of the classic
        # group's session (three heartbeat timeouts).
        if heartbeat_timeout_ms is None:
            heartbeat_timeout_ms = int(cfg.get("session.timeout.ms", 45_000)) // 3  # type: ignore[call-overload]
        self._answer_within_us = max(1_000_000, heartbeat_timeout_ms * 1000)
        self._steady = False
        self._assigned: set[int] = set()
        self._topic: str | None = None
        self._on_assign = self._on_revoke = _NO_CALLBACK
        self._watch = None if heal_after is None else ProgressWatch(
            "leader_consumer", heal_after, group_probe(config, str(config.get("group.id")))
        )
        self._consumer = self._open()
        self._closed = False

    def _open(self) -> Consumer:
        cfg = dict(self._cfg)
        consumer: Consumer | None = None

        def stats(stats_json: str) -> None:
            if consumer is self._consumer:  # not a replaced consumer's last words
                self._on_stats(stats_json)

        cfg["stats_cb"] = stats
        try:
            consumer = Consumer(cfg)
        except KafkaException as e:
            raise refused_configuration("consumer", e) from None
        return consumer

    def _on_stats(self, stats_json: str) -> None:
        try:
            stats = json.loads(stats_json)
        except ValueError:
            return
        brokers = stats.get("brokers", {}).values()
        # Learned from the metadata, or the bootstrap servers librdkafka went back to; not its
        # internal or logical (group coordinator) handles.
        self.known_brokers = sum(1 for b in brokers if b.get("source") in ("learned", "configured"))
        self.connected = any(self._answering(b) for b in brokers if b.get("nodeid", -1) >= 0)
        group = stats.get("cgrp") or {}
        self._steady = group.get("state") == "up" and group.get("join_state") == "steady"

    def _answering(self, broker: dict[str, Any]) -> bool:
        """Up, and either nothing awaits its answer or it answered recently (rxidle: the
        microseconds since it last sent anything, -1 if never)."""
        if broker.get("state") != "UP":
            return False
        if not broker.get("waitresp_cnt"):
            return True
        idle = broker.get("rxidle", -1)
        return isinstance(idle, int) and 0 <= idle < self._answer_within_us

    def _on_error(self, err: KafkaError) -> None:
        if err.code() == KafkaError._ALL_BROKERS_DOWN:
            self.connected = False
        elif is_authorization_failure(err.name() or ""):
            self._refusal = err
        log.debug("leader consumer: %s", err.str())

    def _refused(self, err: KafkaError) -> Exception:
        """An ACL refused the group or the leader topic: the harvester cannot lead, ever."""
        if err.code() == KafkaError.GROUP_AUTHORIZATION_FAILED:
            acl = Acl("group", str(self._config.get("group.id")), ("Read",), "joining the leader group")
        else:
            acl = Acl("topic", self._topic or "", ("Read",), "reading the heartbeats back")
        return refused(self._config, acl, err.str())

    def subscribe(
        self,
        topic: str,
        on_assign: Callable[[list[int]], None],
        on_revoke: Callable[[list[int]], None],
    ) -> None:
        self._topic, self._on_assign, self._on_revoke = topic, on_assign, on_revoke
        self._subscribe(self._consumer)

    def _subscribe(self, consumer: Consumer) -> None:
        def assigned(c: Consumer, partitions: list[TopicPartition]) -> None:
            if c is self._consumer:
                numbers = [p.partition for p in partitions]
                self._assigned.update(numbers)
                self._on_assign(numbers)

        def revoked(c: Consumer, partitions: list[TopicPartition]) -> None:
            if c is self._consumer:
                numbers = [p.partition for p in partitions]
                self._assigned.difference_update(numbers)
                self._on_revoke(numbers)

        assert self._topic is not None
        consumer.subscribe([self._topic], on_assign=assigned, on_revoke=revoked, on_lost=revoked)

    def poll(self, timeout: float) -> int:
        return len(self.poll_partitions(timeout))

    def poll_partitions(self, timeout: float) -> list[int]:
        """Serve group callbacks and read what arrived; the partition of every message read."""
        received: list[int] = []
        consumer = self._consumer
        msg = consumer.poll(timeout)
        if self._refusal is not None:
            raise self._refused(self._refusal)
        while msg is not None:
            err = msg.error()
            if err is None:
                received.append(msg.partition() or 0)
            elif is_authorization_failure(err.name() or ""):
                raise self._refused(err)
            elif err.fatal():
                raise KafkaException(err)
            elif err.code() != KafkaError._PARTITION_EOF:
                log.debug("leader consumer: %s", err.str())
            msg = consumer.poll(0)
        watch = self._watch
        if watch is not None:
            if received or self._steady:
                watch.progressed()
            elif watch.stuck():
                self._replace(watch)
        return received

    def _replace(self, watch: ProgressWatch) -> None:
        old = self._consumer
        lost, self._assigned = sorted(self._assigned), set()
        if lost:  # the old member's partitions are gone with it: the owner steps down first
            self._on_revoke(lost)
        self._steady, self.connected, self.known_brokers = False, None, None
        self._consumer = self._open()
        self._subscribe(self._consumer)
        threading.Thread(target=_close, args=(old,), name="pyharvest-close-stuck-consumer", daemon=True).start()
        watch.replaced(f"{len(lost)} partition(s) revoked" if lost else "")

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._consumer.close()


def _close(consumer: Consumer) -> None:
    try:
        consumer.close()
    except Exception as e:  # noqa: BLE001 - it is being discarded anyway
        log.debug("closing a replaced leader consumer: %s", e)
