"""What a fresh client gets from the cluster: the probes behind the heal of a stuck client
(:class:`~pyharvest.core.healing.stuck_clients.ProgressWatch`).

Each probe opens an admin client of the stuck client's own configuration (so it takes the same
network path: a client cut off from a broker has a probe cut off too) and asks for what the
stuck client waits on. Run on the watch's thread, never on the client's."""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection, Iterable

from confluent_kafka import KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, ClusterMetadata, ConfigResource, OffsetSpec, ResourceType  # type: ignore[attr-defined]

from pyharvest.bindings.kafka.admin import admin_client
from pyharvest.core.healing.stuck_clients import ClusterProbe, ProbeAnswer
from pyharvest.core.ports.kafka import KafkaConfigMap

__all__ = ["group_probe", "offsets_partition", "partitions_probe"]

OFFSETS_TOPIC = "__consumer_offsets"

# What only a consumer or a producer takes, or would make the admin client more than one:
# left out of the probe's client (librdkafka warns of a property its client does not take).
_NOT_FOR_A_PROBE = ("session.", "heartbeat.", "partition.assignment", "max.poll", "isolation.", "fetch.",
                    "statistics.", "transactional.", "enable.idempotence", "debug")


# librdkafka (2.16) can abort the process when an admin client is destroyed with a request in
# flight (an assertion on its enqueue-once refcount, seen in tests under broker faults): the
# probes' admin clients are kept, one per configuration, and every answer is awaited a little
# longer than its request's own timeout, so that librdkafka has ended the request first.
_admins: dict[tuple[tuple[str, str], ...], AdminClient] = {}
_admins_lock = threading.Lock()
_GRACE = 2.0


def _probe_admin(config: KafkaConfigMap) -> AdminClient:
    key = tuple(sorted((k, repr(v)) for k, v in config.items() if not k.startswith(_NOT_FOR_A_PROBE)))
    with _admins_lock:
        admin = _admins.get(key)
        if admin is None:
            admin = _admins[key] = admin_client(config, _NOT_FOR_A_PROBE)
        return admin


def _reason(e: BaseException) -> str:
    if isinstance(e, KafkaException) and e.args:
        err = e.args[0]
        return f"{err.name()}: {err.str()}" if hasattr(err, "name") else str(err)
    return f"{type(e).__name__}: {e}" if str(e) else type(e).__name__


def offsets_partition(group_id: str, partitions: int) -> int:
    """The partition of ``__consumer_offsets`` that holds ``group_id`` (whose leader is the
    group's coordinator): Kafka's ``abs(groupId.hashCode()) % partitions``, with Java's
    32-bit string hash over UTF-16 code units."""
    h = 0
    units = group_id.encode("utf-16-be")
    for i in range(0, len(units), 2):
        h = (31 * h + int.from_bytes(units[i:i + 2], "big")) & 0xFFFFFFFF
    signed = h - (1 << 32) if h & 0x80000000 else h
    return (0 if signed == -(1 << 31) else abs(signed)) % partitions


def _writable(admin: AdminClient, metadata: ClusterMetadata, topic: str, partitions: Iterable[int] | None,
              timeout: float) -> ProbeAnswer | None:
    """Why a fresh client cannot write to ``partitions`` of ``topic`` (every partition: None),
    or None if it can: each has a leader and at least ``min.insync.replicas`` in-sync replicas."""
    found = metadata.topics.get(topic)
    if found is None:
        return ProbeAnswer(False, f"topic {topic!r} is not in the metadata")
    if found.error is not None:
        return ProbeAnswer(False, f"topic {topic!r}: {found.error.str()}")
    resource = ConfigResource(ResourceType.TOPIC, topic)
    entry = admin.describe_configs([resource], request_timeout=timeout)[resource].result(timeout + _GRACE).get(
        "min.insync.replicas")
    min_isr = int(entry.value) if entry is not None and entry.value is not None else 1
    for p in sorted(found.partitions) if partitions is None else partitions:
        part = found.partitions.get(p)
        if part is None or part.leader < 0:
            return ProbeAnswer(False, f"partition {p} of {topic!r} has no leader")
        if len(part.isrs) < min_isr:
            return ProbeAnswer(False, f"partition {p} of {topic!r} has {len(part.isrs)} in-sync replica(s) and "
                                      f"min.insync.replicas is {min_isr}: Kafka refuses its writes "
                                      "(NOT_ENOUGH_REPLICAS)")
    return None


def group_probe(config: KafkaConfigMap, group_id: str) -> ClusterProbe:
    """Whether the group's coordinator answers a fresh client and can write the group's state:
    what a leader consumer needs to join. The coordinator is the leader of the group's
    ``__consumer_offsets`` partition; it must have its in-sync replicas, and answer a
    ListOffsets for that partition.

    Not DescribeGroups: librdkafka (2.16) can abort the process on a coordinator request whose
    coordinator goes away meanwhile (an assertion on its enqueue-once refcount, seen twice while
    a cluster's coordinator was killed), and a probe runs precisely then."""

    def probe(timeout: float) -> ProbeAnswer:
        admin = _probe_admin(config)
        try:
            metadata = admin.list_topics(OFFSETS_TOPIC, timeout=timeout)
            offsets = metadata.topics.get(OFFSETS_TOPIC)
            if offsets is None or offsets.error is not None or not offsets.partitions:
                return ProbeAnswer(False, f"{OFFSETS_TOPIC} is not in the metadata (no group has a coordinator yet)")
            partition = offsets_partition(group_id, len(offsets.partitions))
            refused = _writable(admin, metadata, OFFSETS_TOPIC, [partition], timeout)
            if refused is not None:
                return ProbeAnswer(False, f"the coordinator of group {group_id!r} cannot write: {refused.detail}")
            leader = offsets.partitions[partition].leader
            latest = OffsetSpec.latest()  # type: ignore[no-untyped-call]
            asked = admin.list_offsets({TopicPartition(OFFSETS_TOPIC, partition): latest}, request_timeout=timeout)
            for future in asked.values():
                future.result(timeout + _GRACE)
        except Exception as e:  # noqa: BLE001 - what does not answer, and why
            return ProbeAnswer(False, f"the coordinator of group {group_id!r} does not answer: {_reason(e)}")
        broker = metadata.brokers.get(leader)
        where = f"{broker.host}:{broker.port}" if broker is not None else f"node {leader}"
        return ProbeAnswer(True, f"the coordinator of group {group_id!r} ({where}) answers, with its in-sync replicas")

    return probe


def partitions_probe(config: KafkaConfigMap, topics: Callable[[], Collection[str]]) -> ClusterProbe:
    """Whether every partition of ``topics()`` (what a producer waits on) has a leader that
    answers a fresh client and at least ``min.insync.replicas`` in-sync replicas: a producer
    with ``acks=all`` can write there. With no topic named, whether the cluster answers
    metadata."""

    def probe(timeout: float) -> ProbeAnswer:
        admin = _probe_admin(config)
        wanted = sorted(topics())
        try:
            metadata = admin.list_topics(timeout=timeout)
        except Exception as e:  # noqa: BLE001
            return ProbeAnswer(False, f"no metadata: {_reason(e)}")
        if not wanted:
            return ProbeAnswer(True, f"{len(metadata.brokers)} broker(s) answer metadata")
        partitions: list[TopicPartition] = []
        try:
            for topic in wanted:
                refused = _writable(admin, metadata, topic, None, timeout)
                if refused is not None:
                    return refused
                partitions += [TopicPartition(topic, p) for p in sorted(metadata.topics[topic].partitions)]
            # ListOffsets goes to each partition's leader: it answers this network path.
            latest = OffsetSpec.latest()  # type: ignore[no-untyped-call]
            asked = admin.list_offsets(dict.fromkeys(partitions, latest), request_timeout=timeout)
            for future in asked.values():
                future.result(timeout + _GRACE)
        except Exception as e:  # noqa: BLE001
            return ProbeAnswer(False, f"a partition leader does not answer: {_reason(e)}")
        return ProbeAnswer(True, f"the leaders of {len(partitions)} partition(s) of {', '.join(map(repr, wanted))} "
                                 "answer, with their in-sync replicas")

    return probe
