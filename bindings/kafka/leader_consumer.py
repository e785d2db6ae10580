"""The leader group's consumer over confluent-kafka (:class:`~pyharvest.core.ports.kafka.LeaderConsumer`),
which replaces its librdkafka consumer when that one is stuck outside the group."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from pyharvest.bindings.kafka.admin import client_config, refused_configuration
from pyharvest.bindings.kafka.cluster_probes import group_probe
from pyharvest.core.config.kafka_acls import Acl, is_authorization_failure, refused
from pyharvest.core.errors import TopicError
from pyharvest.core.healing.stuck_clients import ProgressWatch
from pyharvest.core.ports.kafka import KafkaConfigMap

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
    and nothing it still reports reaches the callbacks.

    A static member (``group.instance.id``) that another process with the same id replaced is
    fenced by the broker (librdkafka's fatal FENCED_INSTANCE_ID): it steps down and :meth:`poll`
    raises a :class:`~pyharvest.core.errors.TopicError` naming the id. A static member does not
    leave its group on close by itself (KIP-345: its restart takes its partitions back), so
    :meth:`close` unsubscribes first, which does leave: a graceful stop hands over at once."""

    #: How long :meth:`close` serves the leave (the revocation runs) before closing.
    LEAVE_TIMEOUT = 5.0
    #: How long :meth:`close` waits for librdkafka's close (a leave sent already).
    CLOSE_TIMEOUT = 10.0

    def __init__(
        self, config: KafkaConfigMap, heartbeat_timeout_ms: int | None = None, heal_after: float | None = None
    ) -> None:
        cfg = client_config(config)
        # librdkafka's statistics say whether any broker connection is up (the readiness signal;
        # the consumer protocol's statistics list the brokers alike) and whether the consumer is
        # a steady member of its group (the heal's progress).
        cfg.setdefault("statistics.interval.ms", 1000)
        self._cfg = cfg
        self._instance_id = str(cfg.get("group.instance.id") or "")
        self._config = config
        self._refusal: KafkaError | None = None  # an ACL's refusal seen by error_cb, raised by poll
        self._fenced_by: KafkaError | None = None  # a namesake's fencing seen by error_cb, raised by poll
        self.connected: bool | None = None
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

        def errors(err: KafkaError) -> None:
            # Not a replaced consumer's: a static one is fenced by its replacement, which is no
            # namesake of this process's.
            if consumer is None or consumer is self._consumer:
                self._on_error(err)

        cfg["stats_cb"] = stats
        cfg["error_cb"] = errors
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
        if err.code() == KafkaError.INCONSISTENT_GROUP_PROTOCOL:
            # Members of an older pyharvest (the eager assignor for one shard) lead the group:
            # this one cannot join until they have all stopped; librdkafka retries.
            log.warning("leader group %r: its members assign with another protocol (reapers of an older "
                        "pyharvest, whose single leader assigned eagerly?); this process joins once they have all "
                        "stopped (or give the new ones another leaderGroupID): %s", self._config.get("group.id"),
                        err.str())
            return
        if self._instance_id and _fenced_instance(err):
            # Reported here, not through poll's messages: raised by the next poll.
            self._fenced_by = err
            return
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
        return [p for p, _ in self.poll_heartbeats(timeout)]

    def poll_heartbeats(self, timeout: float) -> list[tuple[int, bytes | None]]:
        """Serve group callbacks and read what arrived; the partition and value of every message read."""
        received: list[tuple[int, bytes | None]] = []
        consumer = self._consumer
        msg = consumer.poll(timeout)
        if self._refusal is not None:
            raise self._refused(self._refusal)
        if self._fenced_by is not None:
            # Never healed by a new client: it would rejoin under the same id and fence the namesake.
            raise self._fenced(self._fenced_by)
        while msg is not None:
            err = msg.error()
            if err is None:
                value = msg.value()
                received.append((msg.partition() or 0, value if isinstance(value, bytes) or value is None
                                 else str(value).encode()))
            elif is_authorization_failure(err.name() or ""):
                raise self._refused(err)
            elif self._instance_id and _fenced_instance(err):
                raise self._fenced(err)
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

    def _fenced(self, err: KafkaError) -> TopicError:
        """Another live process joined with this one's ``group.instance.id``: the broker gave it
        this member's partitions. Step down first (it may already lead them), then say so."""
        lost, self._assigned = sorted(self._assigned), set()
        if lost:
            self._on_revoke(lost)
        return TopicError(
            f"another process joined leader group {self._config.get('group.id')!r} with this reaper's instanceID "
            f"(group.instance.id {self._instance_id!r}): Kafka fenced this older one, which stopped leading. Give "
            f"every live reaper its own instanceID (a StatefulSet's pod name, say). Kafka said: {err.str()}"
        )

    def _replace(self, watch: ProgressWatch) -> None:
        old = self._consumer
        lost, self._assigned = sorted(self._assigned), set()
        if lost:  # the old member's partitions are gone with it: the owner steps down first
            self._on_revoke(lost)
        self._steady, self.connected = False, None
        self._consumer = self._open()
        self._subscribe(self._consumer)
        threading.Thread(target=_close, args=(old,), name="pyharvest-close-stuck-consumer", daemon=True).start()
        watch.replaced(f"{len(lost)} partition(s) revoked" if lost else "")

    def close(self) -> None:
        """Leave the group, then close. librdkafka's cooperative close can hang for good when
        an assignment arrives while it closes (confluentinc/librdkafka#4527, #4883; seen here in
        the sticky-leadership test): so every member leaves first (unsubscribes, and serves its
        revocation, as a static member must anyway), and the close runs on a thread of its own,
        waited for ``CLOSE_TIMEOUT`` seconds at most; one that outlasts it is left to finish
        there, said in the log, and the process's shutdown goes on."""
        if not self._closed:
            self._closed = True
            consumer = self._consumer
            self._leave(consumer)
            closer = threading.Thread(target=_close, args=(consumer,), name="pyharvest-close-leader-consumer",
                                      daemon=True)
            closer.start()
            closer.join(self.CLOSE_TIMEOUT)
            if closer.is_alive():
                log.warning("leader consumer: closing did not finish within %gs (a librdkafka hang); left to "
                            "finish on its own thread, the group notices this member gone within its session",
                            self.CLOSE_TIMEOUT)

    def _leave(self, consumer: Consumer) -> None:
        """Make a static member leave: librdkafka sends no LeaveGroup when a static member
        closes (the group would keep its partitions for a whole session), but it does when it
        unsubscribes. Served until the revocation has run and the leave has gone out: a close
        that begins before skips the leave."""
        try:
            consumer.unsubscribe()
            deadline = time.monotonic() + self.LEAVE_TIMEOUT
            while self._assigned and time.monotonic() < deadline:
                consumer.poll(0.05)
            # The LeaveGroup is sent once the unassignment is done, on librdkafka's own thread.
            for _ in range(4):
                consumer.poll(0.05)
        except KafkaException as e:  # a fenced or unreachable member: close as it is
            log.debug("leader consumer: leaving the group before closing: %s", e)


def _fenced_instance(err: KafkaError) -> bool:
    """librdkafka reports FENCED_INSTANCE_ID as a fatal error (code _FATAL, whose ``fatal()`` is
    not always set on a consumer's error event) with the broker's reason in its text."""
    if err.code() == KafkaError.FENCED_INSTANCE_ID:
        return True
    text = err.str() or ""
    return err.code() == KafkaError._FATAL and ("group.instance.id" in text or "FENCED_INSTANCE" in text)


def _close(consumer: Consumer) -> None:
    try:
        consumer.close()
    except Exception as e:  # noqa: BLE001 - it is being discarded anyway
        log.debug("closing a leader consumer: %s", e)
