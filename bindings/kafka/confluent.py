"""confluent-kafka (librdkafka) behind the engine's Kafka protocols."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Sequence

from confluent_kafka import KafkaError, KafkaException, Message, Producer

# NewTopic's documented import path; confluent_kafka.admin re-exports it without listing it in an __all__.
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
    ResourceType,
)

from pyharvest.bindings.kafka.admin import admin_client as _admin
from pyharvest.bindings.kafka.admin import client_config as _client_config
from pyharvest.bindings.kafka.admin import metadata_within, producer_side, refused_configuration
from pyharvest.bindings.kafka.api_versions import CONSUMER_GROUP_HEARTBEAT, broker_api_keys
from pyharvest.bindings.kafka.cluster_probes import partitions_probe
from pyharvest.bindings.kafka.heartbeat_reader import last_heartbeats
from pyharvest.bindings.kafka.leader_consumer import ConfluentLeaderConsumer
from pyharvest.core.config.kafka_acls import Acl, is_authorization_failure, refused
from pyharvest.core.election.group_protocol import GroupSession, SessionBounds
from pyharvest.core.healing.stuck_clients import HEAL_AFTER_SESSIONS, ProgressWatch
from pyharvest.core.ports.kafka import DeliveryCallback, DeliveryError, KafkaConfigMap, ProduceError, TopicError

__all__ = ["ConfluentClients", "ConfluentLeaderConsumer", "ConfluentProducer", "delivery_error"]

log = logging.getLogger("pyharvest.kafka")

# Errors that recur however often the same record is sent: a poison record, not a passing fault.
_POISON_CODES = frozenset(
    code
    for code in (
        getattr(KafkaError, name, None)
        for name in (
            "MSG_SIZE_TOO_LARGE",
            "_MSG_SIZE_TOO_LARGE",
            "TOPIC_EXCEPTION",
            "INVALID_RECORD",
            "CORRUPT_MESSAGE",
            "INVALID_REQUIRED_ACKS",
            "RECORD_LIST_TOO_LARGE",
            "TOPIC_AUTHORIZATION_FAILED",
            "_INVALID_ARG",
            "_UNKNOWN_TOPIC",
            "UNKNOWN_TOPIC_OR_PART",
        )
    )
    if code is not None
)


# A newer producer (same transactional.id) or a newer epoch took over: this one is fenced.
# The one list of fencing codes: the transactional producer's errors are classified by it too.
FENCING_CODES = frozenset(
    code
    for code in (getattr(KafkaError, n, None) for n in ("PRODUCER_FENCED", "INVALID_PRODUCER_EPOCH", "_FENCED"))
    if code is not None
)
# A producer that got one of these will fail every later message too.
_FATAL_CODES = FENCING_CODES | {code for code in (getattr(KafkaError, "_FATAL", None),) if code is not None}


def delivery_error(err: KafkaError) -> DeliveryError:
    fenced = err.code() in FENCING_CODES
    return DeliveryError(
        err.name() or str(err.code()),
        err.str(),
        retriable=err.code() not in _POISON_CODES,
        fatal=fenced or err.fatal() or err.code() in _FATAL_CODES,
        fenced=fenced,
    )


# A delivery callback must never raise: confluent-kafka (2.x) keeps dispatching the rest of a
# flush's reports with the exception still set, and each later callback then fails in ways that
# name nothing true (seen: "AttributeError: ... object has no attribute '_failed'" for a method
# that exists, and "SystemError: <method 'name' of 'KafkaError' objects> returned a result with
# an exception set"), until the flush raises and the engine of a shard crashes. What went wrong
# is logged with its chain (a SystemError carries the pending exception as its context) and the
# record counts as not delivered: retried, never lost.
_CALLBACK_FAILED = DeliveryError("_CALLBACK", "the delivery report could not be read", retriable=True)
_callback_failures = 0


def _callback_failed(error: Exception, on_delivery: DeliveryCallback) -> None:
    global _callback_failures
    _callback_failures += 1
    if _callback_failures == 1 or _callback_failures % 100 == 0:
        log.warning("a delivery report could not be handled (%d so far); its record is retried: %s",
                    _callback_failures, error, exc_info=error)
    try:
        on_delivery(_CALLBACK_FAILED)
    except Exception:  # noqa: BLE001 - never seen: the first failure was handled, and cleared, above
        log.exception("a delivery report could not be handled twice")


class ConfluentProducer:
    """A producer. With ``heal_after`` (seconds), a librdkafka producer whose messages got no
    answer from any broker for that long, while their partitions' leaders answer a fresh client
    and have their in-sync replicas, is replaced by a new one (:mod:`pyharvest.core.healing.stuck_clients`).

    The replacement keeps every message's one delivery report: what was not sent yet is purged
    (each gets a failed, retriable report, as after :meth:`abandon`); messages already sent
    are left to their answer or their timeout (purged, one could still land after the new
    producer's), and the new producer takes over once none is left. A message that raced the
    swap into the old producer is purged and reported by :meth:`poll` too."""

    def __init__(self, config: KafkaConfigMap, heal_after: float | None = None) -> None:
        self._config = config
        self._producer = self._open()
        #: Set by a delivery report that carries a broker's answer (an error the broker sent too).
        self._answered = False
        #: The topics of messages that failed without a broker's answer since the last one: what
        #: the probe asks about.
        self._unanswered: set[str] = set()
        self._retired: list[tuple[Producer, float]] = []
        self._watch = None if heal_after is None else ProgressWatch(
            "producer", heal_after, partitions_probe(config, lambda: tuple(self._unanswered))
        )

    def _open(self) -> Producer:
        try:
            return Producer(_client_config(producer_side(self._config)))
        except KafkaException as e:
            raise refused_configuration("producer", e) from None

    def produce(
        self,
        topic: str,
        key: str,
        value: bytes | str | None,
        headers: Sequence[tuple[str, str | bytes]],
        on_delivery: DeliveryCallback,
        partition: int | None = None,
    ) -> None:
        # The harvester's per-record hot path: plain arguments (no argument dict, no copy of a
        # headers list) measured 0.6 us less per record than building keyword arguments.
        def delivered(err: KafkaError | None, msg: Message) -> None:
            try:
                if err is None:
                    self._answered = True
                    on_delivery(None)
                else:
                    self._failed(err, msg)
                    on_delivery(delivery_error(err))
            except Exception as e:  # noqa: BLE001 - nothing may escape into librdkafka's dispatch
                _callback_failed(e, on_delivery)

        hdrs = (headers if type(headers) is list else list(headers)) if headers else None
        produce = self._producer.produce
        while True:
            try:
                if partition is None:
                    produce(topic, value, key, on_delivery=delivered, headers=hdrs)
                else:
                    produce(topic, value, key, partition, on_delivery=delivered, headers=hdrs)
                return
            except BufferError:
                # The local queue is full: the delivery thread is draining it; wait for room.
                time.sleep(0.005)
            except KafkaException as e:
                raise ProduceError(delivery_error(e.args[0])) from None

    def _failed(self, err: KafkaError, msg: Message) -> None:
        if err.code() >= 0:  # the broker's own error code: it answered
            self._answered = True
        else:
            topic = msg.topic()
            if topic is not None:
                self._unanswered.add(topic)

    def poll(self, timeout: float) -> int:
        served = int(self._producer.poll(timeout))
        if self._watch is not None:
            self._heal(self._watch)
        return served

    def _heal(self, watch: ProgressWatch) -> None:
        if self._retired:
            self._serve_retired()
        if self._answered or not len(self._producer):  # answered, or waiting on nothing
            self._answered = False
            self._unanswered.clear()
            watch.progressed()
        elif watch.stuck():
            old = self._producer
            old.purge(in_queue=True, in_flight=False, blocking=False)
            old.poll(0)
            if len(old):
                return  # sent messages still await their answer or timeout
            self._producer = self._open()
            self._retired.append((old, time.monotonic() + 1.0))
            watch.replaced()

    def _serve_retired(self) -> None:
        now, kept = time.monotonic(), []
        for old, until in self._retired:
            old.purge(in_queue=True, in_flight=False, blocking=False)
            old.poll(0)
            if now < until or len(old):
                kept.append((old, until))
        self._retired = kept

    def flush(self, timeout: float) -> int:
        return int(self._producer.flush(timeout))

    def abandon(self) -> None:
        # librdkafka would otherwise retry an unanswered produce request on a new connection
        # once the broker is reachable again (an idempotent producer keeps its sequence), long
        # after a successor took over: Apache Kafka appends it. Purged messages get
        # _PURGE_QUEUE / _PURGE_INFLIGHT reports (retriable), served by the next poll.
        self._producer.purge(in_queue=True, in_flight=True, blocking=False)

    def close(self) -> None:
        # Deliberately no flush: the engine decides how long to wait for in-flight records.
        try:
            self._producer.poll(0)
        except KafkaException as e:  # a fatal error, raised again by the poll: what failed said so
            log.debug("closing a producer after a fatal error: %s", e.args[0].str() if e.args else e)
        for old, _ in self._retired:
            old.purge(in_queue=True, in_flight=True, blocking=False)
            with contextlib.suppress(KafkaException):
                old.poll(0)
        self._retired = []


class ConfluentClients:
    """The default :class:`~pyharvest.core.ports.kafka.KafkaClients`, and the
    :class:`~pyharvest.core.election.group_protocol.GroupSessions` of the consumer group protocol."""

    def __init__(self, heal_after: float | None = None) -> None:
        #: Seconds without progress after which a stuck client is replaced
        #: (:func:`pyharvest.core.healing.stuck_clients.heal_after`); None: never.
        self.heal_after = heal_after
        # The heartbeat timeout and session of each consumer-protocol group whose session was
        # set: its leader consumer has no session.timeout.ms to read them from.
        self._heartbeat_timeouts: dict[str, int] = {}
        self._sessions: dict[str, int] = {}

    def producer(self, config: KafkaConfigMap) -> ConfluentProducer:
        return ConfluentProducer(config, self.heal_after)

    def leader_consumer(self, config: KafkaConfigMap) -> ConfluentLeaderConsumer:
        group = str(config.get("group.id"))
        heal = self.heal_after
        if heal is not None and group in self._sessions:  # the broker may have set a longer session
            heal = max(heal, HEAL_AFTER_SESSIONS * self._sessions[group] / 1000)
        return ConfluentLeaderConsumer(config, self._heartbeat_timeouts.get(group), heal)

    def check_consumer_protocol(self, config: KafkaConfigMap) -> None:
        servers, security = str(config.get("bootstrap.servers", "")), str(config.get("security.protocol", "plaintext"))
        keys = broker_api_keys(servers, security)
        if keys is not None and CONSUMER_GROUP_HEARTBEAT not in keys:
            raise TopicError(
                f"groupProtocol is consumer, but the broker at {config.get('bootstrap.servers')!r} does not speak "
                "Kafka's consumer group protocol (KIP-848: no ConsumerGroupHeartbeat API). It needs Apache Kafka 4.0 "
                "or newer; the embedded broker (Tansu) and older brokers speak only the classic protocol: set "
                "groupProtocol: classic"
            )

    def session_bounds(self, config: KafkaConfigMap, timeout: float = 10.0) -> SessionBounds | None:
        admin = _admin(config)
        try:
            brokers = list(admin.list_topics(timeout=timeout).brokers)
            resource = ConfigResource(ResourceType.BROKER, str(brokers[0]))
            found = admin.describe_configs([resource], request_timeout=timeout)[resource].result(timeout)
        except Exception as e:  # noqa: BLE001 - no permission, an old broker: the bounds stay unknown
            log.info("cannot read the broker's bounds on a consumer group's session: %s", e)
            return None

        def ms(name: str, default: int) -> int:
            entry = found.get(f"group.consumer.{name}")
            return int(entry.value) if entry is not None and entry.value is not None else default

        d = SessionBounds()
        return SessionBounds(
            ms("min.session.timeout.ms", d.min_session_ms), ms("max.session.timeout.ms", d.max_session_ms),
            ms("min.heartbeat.interval.ms", d.min_heartbeat_ms), ms("max.heartbeat.interval.ms", d.max_heartbeat_ms),
            ms("session.timeout.ms", d.default_session_ms), ms("heartbeat.interval.ms", d.default_heartbeat_ms),
        )

    def set_group_session(
        self, config: KafkaConfigMap, group_id: str, session: GroupSession, timeout: float = 10.0
    ) -> None:
        self._heartbeat_timeouts[group_id] = session.heartbeat_timeout_ms
        self._sessions[group_id] = session.session_ms
        resource = ConfigResource(ResourceType.GROUP, group_id, incremental_configs=[
            ConfigEntry(name, str(value), incremental_operation=AlterConfigOpType.SET)
            for name, value in (("consumer.session.timeout.ms", session.session_ms),
                                ("consumer.heartbeat.interval.ms", session.heartbeat_ms))
        ])
        admin = _admin(config)  # kept until the answer: a client destroyed first fails its requests
        try:
            admin.incremental_alter_configs([resource], request_timeout=timeout)[resource].result(timeout)
        except KafkaException as e:
            if is_authorization_failure(e.args[0].name() or ""):
                why = "setting the session heartbeatTimeout asks for (groupProtocol: consumer)"
                raise refused(config, Acl("group", group_id, ("AlterConfigs",), why), e.args[0].str()) from None
            raise TopicError(f"cannot set the session of group {group_id!r}: {e.args[0].str()}") from None
        except Exception as e:  # noqa: BLE001 - e.g. a timeout from the future
            raise TopicError(f"cannot set the session of group {group_id!r} within {timeout:g}s: {e}") from None

    def last_heartbeats(
        self, config: KafkaConfigMap, topic: str, partitions: int, timeout: float
    ) -> dict[int, bytes | None]:
        return last_heartbeats(config, topic, partitions, timeout)

    def topic_partitions(self, config: KafkaConfigMap, topic: str, timeout: float = 10.0) -> int:
        """How many partitions ``topic`` has (0 when it does not exist).

        Asked right after :meth:`ensure_topic`: on a cluster, a topic just created reaches the
        brokers' metadata one by one, and a broker that has not heard of it yet answers that it
        does not exist (seen: a reaper that refused to start, "leader topic has 0 partition(s)"),
        so an absent topic is asked about again, for up to a few seconds."""
        admin = _admin(config)
        deadline = time.monotonic() + min(timeout, 5.0)
        while True:
            try:
                found = admin.list_topics(topic, timeout=timeout).topics.get(topic)
            except KafkaException as e:
                raise TopicError(f"cannot read the metadata of topic {topic!r}: {e.args[0].str()}") from None
            if found is not None and found.error is not None and is_authorization_failure(found.error.name() or ""):
                raise refused(config, Acl("topic", topic, ("Read",), "reading its partitions"), found.error.str())
            if (found is not None and found.error is None and found.partitions) or time.monotonic() > deadline:
                return 0 if found is None or found.error is not None else len(found.partitions)
            time.sleep(0.1)

    def ensure_topic(self, config: KafkaConfigMap, topic: str, partitions: int = 1, timeout: float = 10.0) -> None:
        errors: list[KafkaError] = []
        admin = _admin(config, errors=errors)
        metadata = metadata_within(config, admin, errors, timeout)
        if topic in metadata.topics and metadata.topics[topic].error is None:
            return
        futures = admin.create_topics([NewTopic(topic, partitions)], operation_timeout=timeout)
        try:
            futures[topic].result(timeout)
        except KafkaException as e:
            err = e.args[0]
            if err.code() == KafkaError.TOPIC_ALREADY_EXISTS:
                return
            if is_authorization_failure(err.name() or ""):
                why = (f"creating it: it does not exist (or Read, which shows it, is missing); or create it "
                       f"beforehand with {partitions} partition(s)")
                raise refused(config, Acl("topic", topic, ("Create",), why), err.str()) from None
            raise TopicError(
                f"topic {topic!r} does not exist and could not be created ({err.str()}); "
                f"create it with {partitions} partition(s) or grant the harvester Create on it"
            ) from None
        except Exception as e:  # noqa: BLE001 - e.g. a timeout from the future
            raise TopicError(f"topic {topic!r} could not be created within {timeout:g}s: {e}") from None
        log.info("created topic %r with %d partition(s)", topic, partitions)
