"""Fast NELI on a fake group: which shards lead, fencing per shard, revocations that wait for
the engine, clear errors for a leader topic of the wrong size, and the single leader as the
one-shard group."""

from __future__ import annotations

import threading

import pytest

from pyharvest.core.election.lease import LeaderStatus
from pyharvest.core.election.neli import Neli, ShardGroup
from pyharvest.core.errors import TopicError
from pyharvest.core.ports.kafka import DeliveryError
from tests.helpers.group_fakes import Clients, Clock, Consumer


def make(shards: int = 4, partitions: int | None = None):
    clients, clock = Clients(shards if partitions is None else partitions), Clock()
    assigned: list[int] = []
    group = ShardGroup(clients, {}, "app.neli", "app", "me", shards, heartbeat_timeout=1.0, min_poll_interval=0.01,
                       poll_duration=0.0, on_assigned=assigned.append, clock=clock)
    statuses: dict[int, list[LeaderStatus]] = {p: [] for p in range(shards)}
    for lease in group.leases:
        lease.bind(statuses[lease.shard].append)
    return group, clients, clock, statuses, assigned


def test_joins_with_incremental_assignment_and_leads_what_it_owns() -> None:
    group, clients, _clock, statuses, assigned = make()
    group.start()
    assert clients.consumer.config["partition.assignment.strategy"] == "cooperative-sticky"
    clients.consumer.to_assign = [1, 3]
    group.pulse()
    assert assigned == [1, 3] and group.owned == {1, 3}
    # The engine learns on its own thread, at its next pulse.
    assert statuses[1] == [] and group.leases[1].pulse() is True
    assert statuses[1] == [LeaderStatus.ACQUIRED]
    assert group.leases[0].pulse() is False and statuses[0] == []
    assert sorted(clients.producer_.heartbeats) == [1, 3]  # one heartbeat per owned shard


def test_a_revocation_steps_the_engine_down_before_the_rebalance_goes_on() -> None:
    group, clients, _clock, statuses, _ = make()
    group.start()
    clients.consumer.to_assign = [0, 2]
    group.pulse()
    group.leases[0].pulse()
    group.leases[2].pulse()
    clients.consumer.to_revoke = [2]
    group.pulse()  # the REVOKED handler (quiesce) ran inside the group's poll
    assert statuses[2] == [LeaderStatus.ACQUIRED, LeaderStatus.REVOKED]
    assert statuses[0] == [LeaderStatus.ACQUIRED]  # the other shard never paused
    assert group.owned == {0} and group.leases[2].pulse() is False


def test_a_shard_revoked_before_its_engine_heard_of_it_tells_the_engine_nothing() -> None:
    group, clients, _clock, statuses, _ = make()
    group.start()
    clients.consumer.to_assign = [1]
    group.pulse()
    clients.consumer.to_revoke = [1]
    group.pulse()
    assert group.leases[1].pulse() is False and statuses[1] == []


def test_each_shard_is_fenced_on_its_own_and_comes_back_with_a_heartbeat() -> None:
    group, clients, clock, statuses, _ = make()
    group.start()
    clients.consumer.to_assign = [0, 1]
    group.pulse()
    group.leases[0].pulse()
    group.leases[1].pulse()
    clock.now += 0.8
    clients.consumer.returned = [0]  # shard 1's heartbeats stop coming back
    group.pulse()
    clock.now += 0.5
    group.pulse()
    assert statuses[1] == [LeaderStatus.ACQUIRED, LeaderStatus.FENCED]
    assert statuses[0] == [LeaderStatus.ACQUIRED]
    clients.consumer.returned = [1]
    group.pulse()
    assert group.leases[1].pulse() is True
    assert statuses[1] == [LeaderStatus.ACQUIRED, LeaderStatus.FENCED, LeaderStatus.ACQUIRED]


def test_heartbeats_refused_for_a_heartbeat_timeout_say_why_the_member_cannot_lead() -> None:
    group, clients, clock, _, _ = make()
    group.start()
    clients.consumer.to_assign = [0, 1]
    group.pulse()
    clients.producer_.refusal = DeliveryError("NOT_ENOUGH_REPLICAS", "Broker: Not enough in-sync replicas")
    group.pulse()
    clock.now += 0.9
    group.pulse()
    assert group.broker_error is None  # a blip (a leader moving) is not a refusal
    clock.now += 0.2
    assert group.broker_error == (
        "Kafka has refused the heartbeats to 'app.neli' for 1s: NOT_ENOUGH_REPLICAS: Broker: Not enough in-sync replicas"
    )
    clients.producer_.refusal = None
    group.pulse()
    assert group.broker_error is None


def test_status_changes_reach_an_engine_in_order_from_both_threads() -> None:
    group, clients, _clock, statuses, _ = make(shards=1)
    group.start()
    for _ in range(200):
        clients.consumer.to_assign = [0]
        group.pulse()
        t = threading.Thread(target=group.leases[0].pulse)
        t.start()
        clients.consumer.to_revoke = [0]
        group.pulse()
        t.join()
    seen = statuses[0]
    # ACQUIRED and REVOKED alternate: never a revocation before its acquisition, never two in a row.
    assert all(a != b for a, b in zip(seen, seen[1:], strict=False))
    assert not seen or seen[0] is LeaderStatus.ACQUIRED


@pytest.mark.parametrize(("partitions", "advice"), [(2, "add partitions"), (8, "cannot remove partitions")])
def test_a_leader_topic_of_another_size_is_refused_with_the_fix(partitions: int, advice: str) -> None:
    group, *_ = make(shards=4, partitions=partitions)
    with pytest.raises(TopicError, match=f"has {partitions} partition.*shards is 4.*{advice}"):
        group.start()


def test_a_partition_beyond_the_shards_means_another_reaper_disagrees() -> None:
    group, clients, *_ = make(shards=2)
    group.start()
    clients.consumer.to_assign = [3]
    with pytest.raises(TopicError, match="every reaper of a group needs the same number"):
        group.pulse()


def test_the_leader_group_settings_keep_fencing_first_and_hear_of_rebalances_within_a_second() -> None:
    from pyharvest.core.election.group_protocol import leader_client_configs

    consumer, producer = leader_client_configs({"bootstrap.servers": "k:9092"}, "g", 5.0)
    # The group expires a dead member only well after a cut-off leader fenced itself.
    assert consumer["session.timeout.ms"] == 15_000 and producer["delivery.timeout.ms"] == 5_000
    # Survivors hear of a rebalance within a second, not librdkafka's 3 s.
    assert consumer["heartbeat.interval.ms"] == 1_000
    consumer, _ = leader_client_configs({"heartbeat.interval.ms": 3000, "session.timeout.ms": 1}, "g", 2.0)
    assert consumer["heartbeat.interval.ms"] == 3000  # the operator's choice wins
    assert consumer["session.timeout.ms"] == 6000  # but not against fencing


def single_leader(partitions: int = 1):
    clients, clock = Clients(partitions), Clock()
    statuses: list[LeaderStatus] = []
    neli = Neli(clients, {}, "app.neli", "app", "me", heartbeat_timeout=1.0, min_poll_interval=0.01,
                poll_duration=0.0, on_status=statuses.append, clock=clock)
    return neli, clients, clock, statuses


def test_the_single_leader_is_the_one_shard_group_and_assigns_stickily() -> None:
    neli, clients, clock, statuses = single_leader()
    neli.start()
    # The eager assignor gave the one partition to whichever member id sorted first: a member
    # joining took leadership from a healthy leader (issue 49).
    assert clients.consumer.config["partition.assignment.strategy"] == "cooperative-sticky"
    assert "group.instance.id" not in clients.consumer.config  # dynamic unless instance_id is given
    assert neli.poll_due() == 0  # the first poll is not held back
    clients.consumer.to_assign = [0]
    assert neli.pulse() and statuses == [LeaderStatus.ACQUIRED]
    assert clients.producer_.heartbeats == [0]
    clock.now += 0.005
    assert neli.poll_due() > 0 and neli.pulse()  # not due: no poll, no heartbeat
    assert clients.producer_.heartbeats == [0]
    clock.now += 2.0  # no heartbeat came back within heartbeat_timeout
    assert not neli.pulse() and statuses[-1] is LeaderStatus.FENCED
    clock.now += 0.02
    clients.consumer.returned = [0]
    assert neli.pulse() and statuses[-1] is LeaderStatus.ACQUIRED
    clock.now += 0.02
    clients.consumer.to_revoke = [0]
    assert not neli.pulse() and statuses[-1] is LeaderStatus.REVOKED


def test_the_single_leader_refuses_a_leader_topic_made_for_shards() -> None:
    neli, *_ = single_leader(partitions=4)
    with pytest.raises(TopicError, match="has 4 partition.*shards is 1.*cannot remove partitions"):
        neli.start()


class CountingConsumer:
    """A leader consumer written before shards existed: it only counts what it read."""

    def __init__(self) -> None:
        self.inner = Consumer()

    def subscribe(self, topic, on_assign, on_revoke) -> None:
        self.inner.subscribe(topic, on_assign, on_revoke)

    def poll(self, timeout: float) -> int:
        return len(self.inner.poll_partitions(timeout))

    def close(self) -> None:
        pass


def test_a_single_leader_client_that_only_counts_heartbeats_still_leads() -> None:
    neli, clients, clock, statuses = single_leader()
    consumer = clients.consumer = CountingConsumer()  # type: ignore[assignment]
    neli.start()
    consumer.inner.to_assign = [0]
    assert neli.pulse() and statuses == [LeaderStatus.ACQUIRED]
    clock.now += 2.0
    consumer.inner.returned = [0]
    assert neli.pulse() and statuses == [LeaderStatus.ACQUIRED]  # its heartbeat counted: not fenced


def test_readyz_says_why_when_the_broker_answers_but_refuses_the_heartbeats() -> None:
    pytest.importorskip("prometheus_client")
    from pyharvest.bindings.ops.server import health_report
    from pyharvest.core.engine.lifecycle import State
    from pyharvest.core.telemetry.health import Health

    why = "Kafka has refused the heartbeats to 'app.neli' for 3s: NOT_ENOUGH_REPLICAS: Broker: Not enough in-sync replicas"

    class Harvester:
        state = State.RUNNING
        blocked_keys = ()
        blocked_key_count = 0

        def health(self) -> Health:
            return Health(running=True, leader=False, broker_connected=True, database_connected=True, broker_error=why)

    ready, body = health_report(Harvester())  # type: ignore[arg-type]
    assert not ready and body["down"] == ["broker"] and body["errors"] == {"broker": why}


class UnreadyTable:
    """A table prepared for another number of shards: the binding refuses the shard's mark."""

    def mark(self, leader_id, limit):
        return []

    def purge(self, ids):
        return 0

    def reset(self, ids, leader_id=None):
        return 0

    def dispose(self) -> None:
        pass

    def for_shard(self, shards: int, shard: int):
        from pyharvest.core.errors import BindingError

        raise BindingError(f"outbox table 'outbox' has no index for {shards} shards (outbox_shards{shards})")


def test_a_table_and_a_leader_topic_both_made_for_other_shards_are_reported_together() -> None:
    from pyharvest import Config
    from pyharvest.core.engine.sharded import ShardedHarvestEngine
    from pyharvest.core.errors import BindingError

    config = Config(leader_topic="app.neli", leader_group_id="app", data_source="fake://", shards=3)
    engine = ShardedHarvestEngine(config, binding=UnreadyTable(), kafka=Clients(2))  # type: ignore[arg-type]
    with pytest.raises(BindingError) as failed:
        engine.start()
    message = str(failed.value)
    assert message.startswith("two things keep shards: 3 from starting: 1) outbox table 'outbox' has no index for 3")
    assert "2) leader topic 'app.neli' has 2 partition(s) but shards is 3" in message
    # Only the table: its error alone, as before.
    alone = ShardedHarvestEngine(config, binding=UnreadyTable(), kafka=Clients(3))  # type: ignore[arg-type]
    with pytest.raises(BindingError, match=r"^outbox table 'outbox' has no index for 3 shards"):
        alone.start()


def test_a_static_member_leads_its_first_assignment_once_a_namesake_has_been_fenced() -> None:
    # A second live process with the same instance id takes the shards at once; the older one
    # hears it is fenced at its next group heartbeat (a fifteenth of the session: 1 s for a
    # 5 s heartbeat timeout). The newcomer waits two of those, and a poll, before leading.
    clients, clock = Clients(1), Clock()
    statuses: list[LeaderStatus] = []
    neli = Neli(clients, {}, "app.neli", "app", "me", heartbeat_timeout=5.0, min_poll_interval=0.01,
                poll_duration=0.0, on_status=statuses.append, clock=clock, instance_id="reaper-0")
    neli.start()
    assert clients.consumer.config["group.instance.id"] == "reaper-0"
    clients.consumer.to_assign = [0]
    clients.consumer.returned = [0]  # a heartbeat coming back does not cut the wait short
    assert not neli.pulse() and statuses == []
    clock.now += 1.5
    clients.consumer.returned = [0]
    assert not neli.pulse()
    clock.now += 0.52
    assert neli.pulse() and statuses == [LeaderStatus.ACQUIRED]
    # Later assignments come through rebalances (the giver quiesced first): led at once.
    clients.consumer.to_revoke = [0]
    clock.now += 0.02
    assert not neli.pulse() and statuses[-1] is LeaderStatus.REVOKED
    clients.consumer.to_assign = [0]
    clock.now += 0.02
    assert neli.pulse() and statuses[-1] is LeaderStatus.ACQUIRED
