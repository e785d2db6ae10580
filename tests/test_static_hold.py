"""A static member's held first assignment (core/election/static_hold.py), on a fake group: the
hold counts from the shard's last heartbeat when no other process's heartbeat shows, and is
whole when one does, when the last heartbeat cannot be read, or when this process's own
heartbeats do not come back. And what heartbeats say of their sender, for a standby's "led by"."""

from __future__ import annotations

import threading

from pyharvest.core.election.heartbeats import Heartbeats, HeartbeatSender, parse_heartbeat
from pyharvest.core.election.leader_watch import LeaderWatch
from pyharvest.core.election.neli import ShardGroup
from tests.helpers.group_fakes import Clients, Clock, Consumer, Producer
from tests.helpers.waiting import wait_until

HOLD = 2 * 1.0 + 0.1  # two group heartbeat intervals (heartbeatTimeout 5 s) and a poll


class ValuesProducer(Producer):
    """Records the heartbeats' values too."""

    def __init__(self) -> None:
        super().__init__()
        self.values: list[bytes] = []

    def produce(self, topic, key, value, headers, on_delivery, partition=None) -> None:  # noqa: ANN001
        self.values.append(value)
        super().produce(topic, key, value, headers, on_delivery, partition)


class ValuesConsumer(Consumer):
    """Gives the values of what it read: ``beats`` come back at the next poll."""

    def __init__(self) -> None:
        super().__init__()
        self.beats: list[tuple[int, bytes | None]] = []

    def poll_heartbeats(self, timeout: float) -> list[tuple[int, bytes | None]]:
        self.poll_partitions(timeout)
        out, self.beats = self.beats, []
        return out


class ReadingClients(Clients):
    """Clients that read the leader topic's last heartbeats: ``last`` (an exception is raised)."""

    def __init__(self, last: dict[int, bytes | None] | Exception) -> None:
        super().__init__(1)
        self.consumer = ValuesConsumer()
        self.producer_ = ValuesProducer()
        self.last = last
        self.reads = 0

    def last_heartbeats(self, config, topic, partitions, timeout):  # noqa: ANN001
        self.reads += 1
        if isinstance(self.last, Exception):
            raise self.last
        return self.last


class Wall:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def beat(sent_at: float, token: str = "0123456789ab", name: str = "reaper-0") -> bytes:
    return f"{int(sent_at * 1e9)}%{name}%host-a%4242%{token}%reaper-0".encode()


def static_group(clients: ReadingClients) -> tuple[ShardGroup, Clock, Wall]:
    clock, wall = Clock(), Wall()
    group = ShardGroup(clients, {}, "app.neli", "app-group", "reaper-0", 1, heartbeat_timeout=5.0,
                       min_poll_interval=0.1, poll_duration=0.0, clock=clock, instance_id="reaper-0",
                       wall_clock=wall)
    group.start()
    return group, clock, wall


def assigned(group: ShardGroup, clients: ReadingClients) -> None:
    assert clients.reads == 0  # read at the assignment, not at start
    clients.consumer.to_assign = [0]
    group.pulse()
    assert 0 in group.owned and not group.leases[0].is_leader
    # The last heartbeats are read on a thread of their own as the shard is assigned.
    wait_until(lambda: clients.reads == 1, what="the last heartbeats read")
    # None is sent while they are read (the read would find its own); then the next pulse sends one.
    wait_until(lambda: (group.pulse(), clients.producer_.values)[1], what="a heartbeat sent after the read")


def own_back(group: ShardGroup, clients: ReadingClients) -> None:
    clients.consumer.beats = [(0, clients.producer_.values[-1])]


def test_a_silent_previous_holder_is_not_waited_for_a_whole_hold():
    clients = ReadingClients({0: beat(1_000_000.0 - 3.0)})  # the killed process's last, 3 s before
    group, clock, _ = static_group(clients)
    assigned(group, clients)
    clock.now += 0.5  # the short window (5 x minPollInterval)
    group.pulse()
    assert not group.leases[0].is_leader  # its own heartbeat has not come back yet
    own_back(group, clients)
    group.pulse()
    assert group.leases[0].is_leader
    group.close()


def test_the_hold_counts_from_the_last_heartbeat():
    clients = ReadingClients({0: beat(1_000_000.0 - 0.5)})  # killed half a second before the restart
    group, clock, wall = static_group(clients)
    assigned(group, clients)
    clock.now += 0.5
    wall.now += 0.5
    own_back(group, clients)
    group.pulse()
    assert not group.leases[0].is_leader  # 1.0 s since the last heartbeat, less than the hold
    clock.now += HOLD - 1.0 - 0.05
    wall.now += HOLD - 1.0 - 0.05
    group.pulse()
    assert not group.leases[0].is_leader
    clock.now += 0.1
    wall.now += 0.1
    group.pulse()
    assert group.leases[0].is_leader  # the hold has passed since the last heartbeat, not since the assignment
    group.close()


def test_another_processs_heartbeat_gives_the_whole_hold_back():
    clients = ReadingClients({0: beat(1_000_000.0 - 10.0)})
    group, clock, wall = static_group(clients)
    assigned(group, clients)
    clients.consumer.beats = [(0, beat(wall.now, token="namesake9999"))]  # a live namesake's
    group.pulse()
    clock.now += 0.6
    own_back(group, clients)
    group.pulse()
    assert not group.leases[0].is_leader
    clock.now += HOLD - 0.6
    group.pulse()
    assert group.leases[0].is_leader  # the whole hold, from the assignment
    group.close()


def test_without_the_last_heartbeats_or_its_own_back_the_hold_is_whole():
    for clients in (ReadingClients(RuntimeError("broker down")), ReadingClients({})):
        group, clock, _ = static_group(clients)
        assigned(group, clients)
        clock.now += 0.6
        if isinstance(clients.last, Exception):
            own_back(group, clients)  # back, but nothing is known of the last holder
        group.pulse()
        assert not group.leases[0].is_leader
        clock.now += HOLD - 0.6
        group.pulse()
        assert group.leases[0].is_leader
        group.close()


def test_a_heartbeat_sent_while_the_member_joined_counts():
    clients = ReadingClients({0: beat(1_000_000.0 - 10.0)})  # what a read at start would have found
    group, clock, wall = static_group(clients)
    clients.last = {0: beat(wall.now - 0.1)}  # a namesake's, sent since: read at the assignment
    assigned(group, clients)
    clock.now += 0.6
    own_back(group, clients)
    group.pulse()
    assert not group.leases[0].is_leader
    group.close()


def test_a_dynamic_member_leads_at_once_and_reads_nothing_at_start():
    clients = ReadingClients({0: beat(1_000_000.0)})
    group = ShardGroup(clients, {}, "app.neli", "app-group", "reaper-0", 1, heartbeat_timeout=5.0,
                       min_poll_interval=0.1, poll_duration=0.0, clock=Clock())
    group.start()
    clients.consumer.to_assign = [0]
    group.pulse()
    assert group.leases[0].is_leader and clients.reads == 0
    group.close()


def test_a_heartbeat_names_its_sender_and_an_older_one_its_name():
    beats = Heartbeats("app.neli", "reaper-0", instance_id="reaper-0")
    producer = ValuesProducer()
    beats.send(producer, 0)
    sender = parse_heartbeat(producer.values[0])
    assert sender is not None
    assert (sender.name, sender.token, sender.instance_id) == ("reaper-0", beats.token, "reaper-0")
    assert sender.pid is not None and f"pid {sender.pid}" in sender.describe()
    old = parse_heartbeat(b"1700000000000000000%billing_7")
    assert old == HeartbeatSender(1_700_000_000.0, "billing_7")
    assert old.describe() == "billing_7"
    assert parse_heartbeat(b"not a heartbeat") is None and parse_heartbeat(None) is None


def test_a_standby_learns_who_leads_from_the_last_heartbeat():
    wall = Wall()
    clients = ReadingClients({0: beat(wall.now - 1.5, name="reaper-1")})
    watch = LeaderWatch(clients, {}, "app.neli", 1, interval=5.0, wall_clock=wall)
    assert watch.leaders() == {}  # the first ask starts a read in the background
    wait_until(lambda: watch.leaders(), what="the leader read")
    seen = watch.leaders()[0]
    assert seen.sender.describe() == "reaper-1 (host-a pid 4242, instanceID reaper-0)"
    assert seen.age == 1.5
    assert clients.reads == 1  # read at most once per interval


def test_no_heartbeat_is_sent_to_a_held_shard_while_its_last_one_is_read():
    release = threading.Event()

    class Slow(ReadingClients):
        def last_heartbeats(self, config, topic, partitions, timeout):  # noqa: ANN001
            release.wait(30)
            return super().last_heartbeats(config, topic, partitions, timeout)

    clients = Slow({0: beat(1_000_000.0 - 10.0)})
    group, _, _ = static_group(clients)
    clients.consumer.to_assign = [0]
    group.pulse()
    group.pulse()
    assert clients.producer_.values == []  # the read would find this process's own heartbeat
    release.set()
    wait_until(lambda: (group.pulse(), clients.producer_.values)[1], what="a heartbeat once read")
    group.close()
