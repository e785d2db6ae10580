"""What readiness says of failing heartbeats: a cluster that answers and refuses them (below
``min.insync.replicas``) is told apart from one that does not answer at all."""

from __future__ import annotations

from pyharvest.core.election.heartbeats import Heartbeats
from pyharvest.core.ports.kafka import DeliveryError


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Refusing:
    """A producer whose every heartbeat fails with ``error``."""

    def __init__(self, error: DeliveryError) -> None:
        self.error = error

    def produce(self, topic, key, value, headers, on_delivery, partition=None) -> None:  # noqa: ANN001
        on_delivery(self.error)


def failing(error: DeliveryError) -> tuple[Heartbeats, Clock]:
    """A member whose heartbeats have failed for 5 s, and that still sends them."""
    clock = Clock()
    beats = Heartbeats("app.neli", "member-1", clock=clock)
    beats.send(Refusing(error), 0)  # type: ignore[arg-type]
    clock.now += 5
    beats.send(Refusing(error), 0)  # type: ignore[arg-type]
    return beats, clock


def test_a_refusal_by_the_cluster_says_refused():
    beats, _ = failing(DeliveryError("NOT_ENOUGH_REPLICAS", "Broker: Not enough in-sync replicas"))
    assert beats.refusal(1.0) == (
        "Kafka has refused the heartbeats to 'app.neli' for 5s: NOT_ENOUGH_REPLICAS: Broker: Not enough in-sync replicas"
    )


def test_an_unreachable_cluster_is_not_said_to_refuse():
    beats, _ = failing(DeliveryError("_MSG_TIMED_OUT", "Local: Message timed out"))
    why = beats.refusal(1.0)
    assert why is not None and "refused" not in why
    assert "has not acknowledged the heartbeats to 'app.neli' for 5s (no broker answered" in why


def test_nothing_is_said_before_the_failures_last_or_once_a_heartbeat_is_delivered():
    beats, _clock = failing(DeliveryError("_TRANSPORT", "Local: Broker transport failure"))
    assert beats.refusal(10.0) is None
    beats._delivered(None)
    assert beats.refusal(0.0) is None


def test_a_member_that_sends_no_heartbeat_has_none_refused():
    # A reaper whose shards moved away while the cluster was below min.insync.replicas owns
    # none and sends none: no delivery will clear its last failure, and as a standby it is
    # ready again once its last heartbeat is older than the heartbeat timeout.
    beats, clock = failing(DeliveryError("NOT_ENOUGH_REPLICAS", "Broker: Not enough in-sync replicas"))
    assert beats.refusal(3.0) is not None
    clock.now += 3.5
    assert beats.refusal(3.0) is None
