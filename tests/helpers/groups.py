"""What a Kafka group looks like from the broker: the condition tests wait for in place of
"let the group settle" (a rebalance's length depends on the broker and the machine's load)."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from confluent_kafka import ConsumerGroupState
from confluent_kafka.admin import AdminClient

__all__ = ["settled"]


def settled(kafka_config: Mapping[str, object], group: str, members: int) -> Callable[[], bool]:
    """A condition: the broker describes ``group`` as stable with ``members`` members, its
    partitions handed out (under either group protocol)."""
    admin = AdminClient(dict(kafka_config))

    def check() -> bool:
        try:
            description = admin.describe_consumer_groups([group], request_timeout=5)[group].result(10)
        except Exception:  # noqa: BLE001 - not described yet (the group is forming): ask again
            return False
        return description.state == ConsumerGroupState.STABLE and len(description.members) == members

    return check
