"""The settings that name one of a few choices, as ``str`` enums: each member is the string a
YAML file writes (``delivery: exactly-once``), so a string is accepted wherever a member is and
compares equal to it."""

from __future__ import annotations

from enum import EnumType, StrEnum

__all__ = ["Delivery", "GroupProtocol", "PoisonPolicy"]


class _Choices(EnumType):
    # dir() of a str enum lists every method of str, and help() renders each of them (some 400
    # lines a class): a choice's class shows its choices instead. The methods are all there.
    def __dir__(cls) -> list[str]:
        return sorted({"__class__", "__doc__", "__members__", "__module__", *cls._member_names_})


class Delivery(StrEnum, metaclass=_Choices):
    """How records reach Kafka (``delivery``): ``at-least-once`` (goharvest's: a leader that
    dies between Kafka's acknowledgement and the purge leaves its records to be published
    again), or ``exactly-once`` (each batch in a Kafka transaction with a progress record, so
    that ``read_committed`` consumers see every record once; needs a cluster with transactions).
    A member is the string a YAML file writes, and equals it."""

    AT_LEAST_ONCE = "at-least-once"
    EXACTLY_ONCE = "exactly-once"


class PoisonPolicy(StrEnum, metaclass=_Choices):
    """What becomes of a record Kafka refuses for good (``poisonPolicy``): ``block`` retries it
    with growing pauses, its key parked behind it meanwhile; ``quarantine`` parks its key after
    ``maxDeliveryAttempts`` (``reaper quarantine`` lists, replays or discards it). A member is
    the string a YAML file writes, and equals it."""

    BLOCK = "block"
    QUARANTINE = "quarantine"


class GroupProtocol(StrEnum, metaclass=_Choices):
    """The leader group's Kafka group protocol (``groupProtocol``): ``classic`` (the client
    holds the session), or ``consumer`` (KIP-848, Apache Kafka 4.0+: the broker does). A member
    is the string a YAML file writes, and equals it."""

    CLASSIC = "classic"
    CONSUMER = "consumer"

