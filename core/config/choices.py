"""The settings that name one of a few choices, as ``str`` enums: each member is the string a
YAML file writes (``delivery: exactly-once``), so a string is accepted wherever a member is and
compares equal to it."""

from __future__ import annotations

from enum import StrEnum

__all__ = ["Delivery", "GroupProtocol", "PoisonPolicy"]


class Delivery(StrEnum):
    """How records reach Kafka (``delivery``)."""

    #: goharvest's: a leader that dies between Kafka's acknowledgement and the purge leaves its
    #: records to be published again by the next leader.
    AT_LEAST_ONCE = "at-least-once"
    #: Each batch in a Kafka transaction with a progress record naming its outbox ids, so that
    #: ``read_committed`` consumers see every record once (needs a cluster with transactions).
    EXACTLY_ONCE = "exactly-once"


class PoisonPolicy(StrEnum):
    """What becomes of a record Kafka refuses for good (``poisonPolicy``)."""

    #: Retry it (with a growing pause) until it goes through or an operator removes it; the
    #: records of its key wait behind it.
    BLOCK = "block"
    #: After ``maxDeliveryAttempts``, park its key in the quarantine table (``reaper quarantine``
    #: lists, replays or discards it); the other keys go on.
    QUARANTINE = "quarantine"


class GroupProtocol(StrEnum):
    """The leader group's Kafka group protocol (``groupProtocol``)."""

    #: Kafka's classic group protocol: the client holds the session.
    CLASSIC = "classic"
    #: KIP-848's consumer protocol (Apache Kafka 4.0+): the broker holds the session.
    CONSUMER = "consumer"

