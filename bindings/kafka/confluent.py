"""confluent-kafka (librdkafka) behind the engine's Kafka protocols."""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Callable, Sequence
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

# NewTopic's documented import path; confluent_kafka.admin re-exports it without listing it in an __all__.
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
    ResourceType,
)

from pyharvest.bindings.kafka.api_versions import CONSUMER_GROUP_HEARTBEAT, broker_api_keys
from pyharvest.bindings.kafka.logs import librdkafka_logger
from pyharvest.core.config.kafka_acls import Acl, describe_principal, is_authorization_failure, refused
from pyharvest.core.election.group_protocol import GroupSession, SessionBounds
from pyharvest.core.errors import KafkaPropertyError
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


# A producer that got one of these will fail every later message too.
_FATAL_CODES = frozenset(
    code
    for code in (
        getattr(KafkaError, n, None) for n in ("PRODUCER_FENCED", "INVALID_PRODUCER_EPOCH", "_FATAL", "_FENCED")
    )
    if code is not None
)


def delivery_error(err: KafkaError) -> DeliveryError:
    return DeliveryError(
        err.name() or str(err.code()),
        err.str(),
        retriable=err.code() not in _POISON_CODES,
        fatal=err.fatal() or err.code() in _FATAL_CODES,
    )


# librdkafka's consumer-only properties: a producer (or admin client) given one logs a
# CONFWARN and ignores it. baseKafkaConfig reaches every client, so they are left out of the
# producer-type ones (the leader group's consumer keeps them).
CONSUMER_ONLY_PROPERTIES = frozenset((
    "session.timeout.ms", "heartbeat.interval.ms", "partition.assignment.strategy", "group.protocol",
    "group.remote.assignor", "group.id", "group.instance.id", "group.protocol.type", "max.poll.interval.ms",
    "enable.auto.commit", "auto.commit.interval.ms", "enable.auto.offset.store", "auto.offset.reset",
    "isolation.level", "fetch.wait.max.ms", "fetch.min.bytes", "fetch.max.bytes", "fetch.message.max.bytes",
    "fetch.error.backoff.ms", "fetch.queue.backoff.ms", "queued.min.messages", "queued.max.messages.kbytes",
    "enable.partition.eof", "check.crcs", "coordinator.query.interval.ms", "consume.callback.max.messages",
))


def producer_side(config: KafkaConfigMap) -> dict[str, object]:
    """``config`` without the consumer-only properties a producer or admin client would warn about."""
    return {k: v for k, v in config.items() if k not in CONSUMER_ONLY_PROPERTIES}


def _client_config(config: KafkaConfigMap) -> dict[str, object]:
    # librdkafka logs through stderr by default; route its logs into Python logging instead,
    # its repeats collapsed.
    return {**config, "logger": librdkafka_logger()}


_REFUSED_PROPERTY = re.compile(r'property:? "([^"]+)"')


def refused_configuration(what: str, error: KafkaException) -> TopicError:
    """The error for a client ``what`` ("producer", "consumer"...) whose configuration librdkafka
    refused: a :class:`KafkaPropertyError` when it names the property, so that the caller can
    name the key the value came from."""
    detail = error.args[0].str().strip() if error.args and isinstance(error.args[0], KafkaError) else str(error)
    message = f"invalid Kafka {what} configuration: {detail}"
    found = _REFUSED_PROPERTY.search(detail)
    return KafkaPropertyError(message, found.group(1), detail) if found else TopicError(message)


class ConfluentProducer:
    def __init__(self, config: KafkaConfigMap) -> None:
        try:
            self._producer = Producer(_client_config(producer_side(config)))
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
        def delivered(err: KafkaError | None, _msg: object) -> None:
            on_delivery(None if err is None else delivery_error(err))

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

    def poll(self, timeout: float) -> int:
        return int(self._producer.poll(timeout))

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


class ConfluentLeaderConsumer:
    def __init__(self, config: KafkaConfigMap, heartbeat_timeout_ms: int | None = None) -> None:
        cfg = _client_config(config)
        # librdkafka's statistics say whether any broker connection is up: the readiness signal
        # (the consumer protocol's statistics list the brokers alike).
        cfg.setdefault("statistics.interval.ms", 1000)
        cfg["stats_cb"] = self._on_stats
        cfg["error_cb"] = self._on_error
        self.connected: bool | None = None
        # A connection that is up but has not answered a waiting request for this long counts
        # as down: a frozen or overloaded broker keeps its sockets open, and librdkafka only
        # times the requests out after socket.timeout.ms (60 s). This is the heartbeat timeout
        # that fences a leader: given under the consumer protocol, else a third of the classic
        # group's session (three heartbeat timeouts).
        if heartbeat_timeout_ms is None:
            heartbeat_timeout_ms = int(cfg.get("session.timeout.ms", 45_000)) // 3  # type: ignore[call-overload]
        self._answer_within_us = max(1_000_000, heartbeat_timeout_ms * 1000)
        self._config = config
        self._topic = ""
        self._refusal: KafkaError | None = None  # an ACL's refusal seen by error_cb, raised by poll
        try:
            self._consumer = Consumer(cfg)
        except KafkaException as e:
            raise refused_configuration("consumer", e) from None
        self._closed = False

    def _on_stats(self, stats_json: str) -> None:
        try:
            brokers = json.loads(stats_json).get("brokers", {})
        except ValueError:
            return
        self.connected = any(self._answering(b) for b in brokers.values() if b.get("nodeid", -1) >= 0)

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
            acl = Acl("topic", self._topic, ("Read",), "reading the heartbeats back")
        return refused(self._config, acl, err.str())

    def subscribe(
        self,
        topic: str,
        on_assign: Callable[[list[int]], None],
        on_revoke: Callable[[list[int]], None],
    ) -> None:
        def assigned(_c: Consumer, partitions: list[TopicPartition]) -> None:
            on_assign([p.partition for p in partitions])

        def revoked(_c: Consumer, partitions: list[TopicPartition]) -> None:
            on_revoke([p.partition for p in partitions])

        self._topic = topic
        self._consumer.subscribe([topic], on_assign=assigned, on_revoke=revoked, on_lost=revoked)

    def poll(self, timeout: float) -> int:
        return len(self.poll_partitions(timeout))

    def poll_partitions(self, timeout: float) -> list[int]:
        """Serve group callbacks and read what arrived; the partition of every message read."""
        received: list[int] = []
        msg = self._consumer.poll(timeout)
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
            msg = self._consumer.poll(0)
        return received

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._consumer.close()


def _admin(config: KafkaConfigMap, errors: list[KafkaError] | None = None) -> AdminClient:
    cfg = _client_config(producer_side(config))
    if errors is not None:  # why no broker answers, for metadata_within()
        cfg["error_cb"] = errors.append
    try:
        # The stub admits only scalar values; librdkafka's Python clients also take a `logger`.
        return AdminClient(cfg)  # type: ignore[arg-type]
    except KafkaException as e:
        raise refused_configuration("admin client", e) from None


def metadata_within(config: KafkaConfigMap, client: Any, errors: list[KafkaError], timeout: float) -> Any:
    """The cluster's metadata, asked by ``client`` (built with ``errors`` as its ``error_cb``)
    for up to ``timeout`` seconds. A login or a TLS handshake the broker refuses ends the wait
    at once, named with what to check; a broker that never answers, at the deadline."""
    deadline = time.monotonic() + timeout
    servers = config.get("bootstrap.servers")
    while True:
        try:
            return client.list_topics(timeout=max(0.1, min(1.0, deadline - time.monotonic())))
        except KafkaException as e:
            client.poll(0)  # serves error_cb
            for err in errors:
                if err.code() == KafkaError._AUTHENTICATION:
                    raise TopicError(
                        f"Kafka at bootstrap.servers={servers!r} refused the login of {describe_principal(config)}: "
                        f"{err.str()}; check sasl.username, sasl.password and sasl.mechanisms"
                    ) from None
                if err.code() == KafkaError._SSL:
                    raise TopicError(
                        f"the TLS handshake with Kafka at bootstrap.servers={servers!r} failed: {err.str()}; check "
                        "ssl.ca.location (the CA that signed the brokers' certificates) and the brokers' host names"
                    ) from None
            if time.monotonic() >= deadline:
                detail = e.args[0].str() if e.args and isinstance(e.args[0], KafkaError) else str(e)
                raise TopicError(
                    f"cannot reach Kafka at bootstrap.servers={servers!r} within {timeout:g}s: {detail}"
                ) from None


class ConfluentClients:
    """The default :class:`~pyharvest.core.ports.kafka.KafkaClients`, and the
    :class:`~pyharvest.core.election.group_protocol.GroupSessions` of the consumer group protocol."""

    def __init__(self) -> None:
        # The heartbeat timeout of each consumer-protocol group whose session was set: its leader
        # consumer has no session.timeout.ms to read it from.
        self._heartbeat_timeouts: dict[str, int] = {}

    def producer(self, config: KafkaConfigMap) -> ConfluentProducer:
        return ConfluentProducer(config)

    def leader_consumer(self, config: KafkaConfigMap) -> ConfluentLeaderConsumer:
        return ConfluentLeaderConsumer(config, self._heartbeat_timeouts.get(str(config.get("group.id"))))

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

    def topic_partitions(self, config: KafkaConfigMap, topic: str, timeout: float = 10.0) -> int:
        """How many partitions ``topic`` has (0 when it does not exist)."""
        admin = _admin(config)
        try:
            found = admin.list_topics(topic, timeout=timeout).topics.get(topic)
        except KafkaException as e:
            raise TopicError(f"cannot read the metadata of topic {topic!r}: {e.args[0].str()}") from None
        if found is not None and found.error is not None and is_authorization_failure(found.error.name() or ""):
            raise refused(config, Acl("topic", topic, ("Read",), "reading its partitions"), found.error.str())
        return 0 if found is None or found.error is not None else len(found.partitions)

    def ensure_topic(self, config: KafkaConfigMap, topic: str, partitions: int = 1, timeout: float = 10.0) -> None:
        errors: list[KafkaError] = []
        admin = _admin(config, errors)
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
