"""What an operator can do about a poison record: one hint per delivery error Kafka (or
librdkafka) gives for good, and what the poison policy does with the key meanwhile.

The hint goes into the warning logged for the failure, the error logged for a quarantine and
the ``hint`` of :class:`~pyharvest.events.DeliveryFailed` and
:class:`~pyharvest.events.RecordQuarantined`.
"""

from __future__ import annotations

from collections.abc import Mapping

from pyharvest.core.config.kafka_acls import Acl, describe_principal, principal_of

__all__ = ["poison_hint", "quarantine_hint"]

_TOO_LARGE = (
    "the record is larger than Kafka accepts. To publish it, raise message.max.bytes in the reaper's "
    "producerKafkaConfig (librdkafka's limit, 1000000 by default, counts the harvester's headers too) and the "
    "topic's max.message.bytes (kafka-configs --alter --entity-type topics --entity-name {topic} "
    "--add-config max.message.bytes=N; or the broker's message.max.bytes); to keep such records out, "
    "the Stasher's max_record_bytes refuses them before they are written, and by default fits the producer's "
    "default"
)

# Error names without librdkafka's leading underscore for its local errors.
_HINTS = {
    "MSG_SIZE_TOO_LARGE": _TOO_LARGE,
    "RECORD_LIST_TOO_LARGE": _TOO_LARGE,
    # A topic the principal may not write to: an ACL to grant, or a record whose topic is wrong
    # (a typo matches no ACL). Either way only this record's key waits.
    "TOPIC_AUTHORIZATION_FAILED": (
        "Kafka refuses {principal} Write on topic {topic}: grant it ({command}), or fix the record's topic"
    ),
    "UNKNOWN_TOPIC_OR_PART": (
        "topic {topic} does not exist: create it (or enable the broker's auto.create.topics.enable)"
    ),
    "UNKNOWN_TOPIC": "topic {topic} does not exist: create it (or enable the broker's auto.create.topics.enable)",
    "TOPIC_EXCEPTION": "{topic!r} is not a valid topic name for this cluster: fix the records' topic",
    "INVALID_RECORD": (
        "the broker refused the record's contents (a compacted topic needs a key; a topic may demand "
        "a timestamp type or a schema): see the broker's log for topic {topic}"
    ),
    "CORRUPT_MESSAGE": "the broker found the record corrupt: see the broker's log for topic {topic}",
    "INVALID_REQUIRED_ACKS": "set acks to all, 1 or 0 in producerKafkaConfig",
    "INVALID_ARG": "librdkafka refused the record's arguments (topic, key or headers): see the error above",
}


def poison_hint(code: str, topic: str, policy: str, kafka_config: Mapping[str, object] | None = None) -> str:
    """What to do about a record Kafka refuses for good with ``code``, under ``policy``; empty
    for a code with nothing to suggest beyond the policy. ``kafka_config``, the producer's
    settings, names the principal an ACL refused (its user name, never a secret)."""
    what = _HINTS.get(code.lstrip("_"), "")
    if what:
        config = kafka_config or {}
        acl = Acl("topic", topic, ("Write",), "publishing the outbox's records")
        command = acl.command(principal_of(config) or "User:NAME", str(config.get("bootstrap.servers", "BROKER:9092")))
        what = what.format(topic=topic, principal=describe_principal(config), command=command) + "; "
    if policy == "quarantine":
        return what + (
            "after limits.maxDeliveryAttempts its key is quarantined: `reaper quarantine list` shows it, "
            "`reaper quarantine replay` retries it once fixed, `reaper quarantine discard` drops it"
        )
    return what + (
        "meanwhile it is retried and holds back its key (poisonPolicy: block); poisonPolicy: quarantine "
        "parks only its key, then `reaper quarantine list` / `replay` / `discard`"
    )


def quarantine_hint(code: str, topic: str, kafka_config: Mapping[str, object] | None = None) -> str:
    """What to do about a quarantined key whose record failed with ``code``."""
    return poison_hint(code, topic, "quarantine", kafka_config)
