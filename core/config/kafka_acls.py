"""The Kafka ACLs each part of pyharvest needs, the principal a client's settings log in as, and
the error that names the ACL a broker refused.

One description serves three readers: ``reaper acls`` prints it as ``kafka-acls.sh`` commands,
``docs/operations.md`` has it as tables, and a client that Kafka refuses names the one ACL
missing (:func:`refused`). Each entry is needed: an operation another implies is left out
(``Describe`` under ``Read`` or ``Write``; ``IdempotentWrite`` on the cluster, which ``Write`` on
any topic implies since Kafka 3.0, KIP-679).

* every harvester: ``Read`` on the leader group; ``Read``, ``Write`` (heartbeats) and ``Create``
  (unless the topic is made beforehand) on the leader topic; ``Write`` on each topic the
  outbox's records name;
* ``groupProtocol: consumer``: ``AlterConfigs`` on the leader group (its session);
* ``delivery: exactly-once``: ``Write`` on the transactional ids ``pyharvest.<leaderGroupID>.``
  (prefixed: one per shard and the start-up probe's), ``Read``, ``Write`` and ``Create`` on the
  progress topic;
* the inbox: ``Read`` on its group and on each topic; ``reaper verify``: ``Read`` on the topic.

The readers of committed records (the progress topic, ``reaper verify``) assign partitions and
never join a group: they need no group ACL (librdkafka asks for a group coordinator all the
same, and the refusal is ignored).
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from pyharvest.core.config.settings import Config
from pyharvest.core.errors import KafkaAuthorizationError

__all__ = [
    "Acl",
    "describe_principal",
    "harvest_acls",
    "inbox_acls",
    "is_authorization_failure",
    "principal_of",
    "refused",
    "transactional_id_prefix",
    "verify_acls",
]

#: kafka-acls.sh's flag for each resource type.
_RESOURCE_FLAGS = {
    "topic": "--topic",
    "group": "--group",
    "transactional-id": "--transactional-id",
    "cluster": "--cluster",
}

# SASL mechanisms whose principal is the user name the client logs in with.
_NAMED_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")


@dataclass(frozen=True, slots=True)
class Acl:
    """Operations a principal needs on one resource (``prefixed``: every name starting so)."""

    resource: str
    name: str
    operations: tuple[str, ...]
    why: str
    prefixed: bool = False

    def arguments(self, principal: str) -> list[str]:
        """kafka-acls.sh's arguments after ``--add`` (the principal, operations, resource)."""
        args = ["--allow-principal", principal]
        for operation in self.operations:
            args += ["--operation", operation]
        args += (
            [_RESOURCE_FLAGS[self.resource]]
            if self.resource == "cluster"
            else [_RESOURCE_FLAGS[self.resource], self.name]
        )
        if self.prefixed:
            args += ["--resource-pattern-type", "prefixed"]
        return args

    def command(self, principal: str, bootstrap_servers: str, command_config: str = "admin.properties") -> str:
        """The ``kafka-acls.sh --add`` command that grants it, quoted for a POSIX shell."""
        head = ["kafka-acls.sh", "--bootstrap-server", bootstrap_servers, "--command-config", command_config, "--add"]
        return shlex.join([*head, *self.arguments(principal)])

    def describe(self) -> str:
        """``Read, Write on topic 'orders'`` (prefixed names end in ``*``)."""
        where = (
            "the cluster"
            if self.resource == "cluster"
            else f"{self.resource} {self.name + ('*' if self.prefixed else '')!r}"
        )
        return f"{', '.join(self.operations)} on {where}"


def transactional_id_prefix(leader_group_id: str) -> str:
    """What every ``transactional.id`` of a leader group starts with, so that one prefixed ACL
    grants them all (:mod:`pyharvest.core.publishing.progress` adds a shard's number or the start-up
    probe's ``probe-<id>``, with no dot)."""
    return f"pyharvest.{leader_group_id}."


def harvest_acls(
    config: Config,
    topics: Iterable[str] = (),
    topic_prefixes: Iterable[str] = (),
    *,
    create_topics: bool = True,
) -> list[Acl]:
    """What a harvester of ``config`` (a resolved :class:`~pyharvest.core.config.settings.Config`) needs.
    The outbox's topics are not in the configuration: they are the ``topics`` (and every topic
    starting with one of ``topic_prefixes``) its records name. ``create_topics=False`` leaves
    out ``Create`` for a leader topic (and progress topic) made beforehand."""
    group = config.leader_group_id
    create = ("Create",) if create_topics else ()
    group_ops = ("Read", "AlterConfigs") if config.group_protocol == "consumer" else ("Read",)
    group_why = "joining the leader group" + (
        " and setting its session (groupProtocol: consumer)" if len(group_ops) > 1 else ""
    )
    out = [
        Acl("group", group, group_ops, group_why),
        Acl(
            "topic",
            config.leader_topic,
            ("Read", "Write", *create),
            "heartbeats: each leader writes and reads back its shards' partitions"
            + ("; creating it if missing" if create else ""),
        ),
    ]
    if config.delivery == "exactly-once":
        out += [
            Acl(
                "transactional-id",
                transactional_id_prefix(group),
                ("Write",),
                "each shard's transactional producer and the start-up probe's",
                prefixed=True,
            ),
            Acl(
                "topic",
                config.progress_topic,
                ("Read", "Write", *create),
                "progress records, read back at each takeover" + ("; creating it if missing" if create else ""),
            ),
        ]
    out += [Acl("topic", t, ("Write",), "publishing the outbox's records") for t in dict.fromkeys(topics)]
    out += [
        Acl("topic", p, ("Write",), "publishing the outbox's records", prefixed=True)
        for p in dict.fromkeys(topic_prefixes)
    ]
    return out


def inbox_acls(group_id: str, topics: Sequence[str]) -> list[Acl]:
    """What an inbox of consumer group ``group_id`` reading ``topics`` needs."""
    return [
        Acl("group", group_id, ("Read",), "joining the inbox's group (and committing offsets, for monitoring)"),
        *(Acl("topic", t, ("Read",), "consuming the messages the inbox applies") for t in dict.fromkeys(topics)),
    ]


def verify_acls(topic: str) -> list[Acl]:
    """What ``reaper verify --topic TOPIC`` needs: it assigns partitions, joining no group."""
    return [Acl("topic", topic, ("Read",), "reading the topic back")]


def is_authorization_failure(code: str) -> bool:
    """Whether Kafka's error ``code`` (``TOPIC_AUTHORIZATION_FAILED``...) is an ACL refusing."""
    return code.lstrip("_").endswith("AUTHORIZATION_FAILED")


def _sasl_mechanism(config: Mapping[str, object]) -> str:
    return str(config.get("sasl.mechanisms") or config.get("sasl.mechanism") or "GSSAPI").upper()


def principal_of(config: Mapping[str, object]) -> str | None:
    """The principal a client with these librdkafka settings logs in as, when the settings say:
    ``User:<sasl.username>`` for SASL PLAIN and SCRAM, ``User:ANONYMOUS`` without SASL or a
    client certificate. ``None`` when the broker derives it (Kerberos, OAuth, a certificate)."""
    protocol = str(config.get("security.protocol") or "plaintext").lower()
    if protocol.startswith("sasl"):
        username = config.get("sasl.username")
        return f"User:{username}" if _sasl_mechanism(config) in _NAMED_MECHANISMS and username else None
    if protocol == "ssl" and any(
        config.get(k) for k in ("ssl.certificate.location", "ssl.certificate.pem", "ssl.keystore.location")
    ):
        return None
    return "User:ANONYMOUS"


def describe_principal(config: Mapping[str, object]) -> str:
    """The principal for a message: :func:`principal_of`, or where the broker finds it."""
    principal = principal_of(config)
    if principal is not None:
        return principal
    if str(config.get("security.protocol") or "").lower().startswith("sasl"):
        return f"the principal the broker maps this client's SASL/{_sasl_mechanism(config)} login to"
    return "the principal the broker maps this client's certificate to (ssl.principal.mapping.rules)"


def refused(config: Mapping[str, object], acl: Acl, detail: str) -> KafkaAuthorizationError:
    """The error for a request Kafka refused for want of ``acl``: who was refused, what to
    grant, and the ``kafka-acls.sh`` command that grants it. ``detail`` is Kafka's own error.
    Only non-secret settings are read from ``config`` (the user name, never a password)."""
    principal = principal_of(config)
    who = describe_principal(config)
    command = acl.command(principal or "User:NAME", str(config.get("bootstrap.servers", "BROKER:9092")))
    message = (
        f"Kafka refused {who} {acl.describe()} ({detail}), which it needs for {acl.why}. Grant it: {command} "
        "(`reaper acls -f FILE` prints every ACL a configuration needs)"
    )
    return KafkaAuthorizationError(message, principal, acl.operations, acl.resource, acl.name)
