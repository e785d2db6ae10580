"""Sticky leadership and static membership on Apache Kafka (issue 49): a member joining takes
no shard from a healthy leader (one shard or six, both group protocols); a static member
(``instanceID``) killed and restarted takes its shard straight back with nothing lost; a
second live process with the same id is fenced with an error naming it; a static member's
graceful stop still hands over at once."""

from __future__ import annotations

import signal
import threading
import time
import uuid
from pathlib import Path

import pytest
import yaml

from pyharvest import OutboxRecord, stasher
from pyharvest.bindings.kafka.confluent import ConfluentClients
from pyharvest.bindings.sql import create_outbox_table
from pyharvest.core.election.lease import LeaderStatus
from pyharvest.core.election.neli import ShardGroup
from tests.helpers.fixtures.kafka import on_embedded_broker
from tests.helpers.groups import settled
from tests.helpers.outbox import wait_empty
from tests.helpers.reapers import Reaper, stop_all
from tests.helpers.topics import create_topic, read_topic, values_per_key
from tests.helpers.waiting import wait_until

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(240)]


class Member:
    """One process's member of the leader group, pulsed on a thread of its own, every status
    change of its shards recorded."""

    def __init__(self, kafka_config, topic: str, group: str, name: str, shards: int, protocol: str) -> None:
        self.statuses: list[tuple[int, LeaderStatus]] = []
        self.group = ShardGroup(
            ConfluentClients(), kafka_config, topic, group, name, shards,
            heartbeat_timeout=2.0, min_poll_interval=0.05, poll_duration=0.0, group_protocol=protocol,
        )
        for lease in self.group.leases:
            lease.bind(lambda status, shard=lease.shard: self.statuses.append((shard, status)))
        # Every shard the group takes from it, as the group's revocation callback hears it (a
        # shard fenced first, its heartbeats late on a loaded machine, tells its lease nothing more).
        self.revoked: list[int] = []
        serve = self.group._revoked

        def revoked(partitions: list[int]) -> None:
            self.revoked.extend(p for p in sorted(partitions) if p in self.group.owned)
            serve(partitions)

        self.group._revoked = revoked  # type: ignore[method-assign]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> Member:
        self.group.start()
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            self.group.pulse()
            for lease in self.group.leases:
                lease.pulse()
            self._stop.wait(0.05)

    def leading(self) -> set[int]:
        """The shards it owns (a shard fenced on a loaded machine stays its own, led again once a
        heartbeat comes back: not a change of leader)."""
        return set(self.group.owned)

    def losses(self) -> list[int]:
        return list(self.revoked)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self.group.close()


@pytest.mark.parametrize("shards", [1, 6])
def test_joins_take_no_shard_from_a_healthy_leader_and_a_rolling_restart_moves_each_once(
    kafka_config, group_protocol, shards
):
    group, topic = f"sticky-{uuid.uuid4().hex[:8]}", f"sticky-{uuid.uuid4().hex[:8]}.neli"
    members: list[Member] = []
    spawned = 0

    def balanced() -> bool:
        led = [m.leading() for m in members]
        every = sorted(s for shards_ in led for s in shards_)
        # Every shard led once; with more shards than members, every member leads some.
        return every == list(range(shards)) and (shards < len(members) or all(led))

    def settle(what: str) -> None:
        wait_until(settled(kafka_config, group, len(members)), 90, f"the group to settle {what}")
        wait_until(balanced, 60, lambda: f"every shard led once {what}: {[m.leading() for m in members]}")

    def moves(change, what: str) -> tuple[int, dict[int, set[int]]]:
        """Run ``change`` and settle; how many shards the members that stay lost, and what each led."""
        before = {id(m): (m.leading(), len(m.losses())) for m in members}
        change()
        settle(what)
        moved = 0
        for m in members:
            if id(m) not in before:
                continue
            led, lost = before[id(m)]
            since = m.losses()[lost:]
            moved += len(since)
            # A member that keeps a shard was never told to stop leading it; one it gave away
            # was given once.
            assert m.leading() >= led - set(since) and sorted(since) == sorted(led - m.leading()), (
                what, led, m.leading(), m.losses()[lost:])
        return moved, {id(m): m.leading() for m in members}

    def join() -> None:
        nonlocal spawned
        members.append(Member(kafka_config, topic, group, f"m{spawned}", shards, group_protocol).start())
        spawned += 1

    try:
        for n in range(3):
            moved, _ = moves(join, f"after member {n} joined")
            newcomer = members[-1].leading()
            print(f"shards {shards}, {group_protocol}: member {n} joined; {moved} shard(s) changed leader, "
                  f"the newcomer leads {sorted(newcomer)}")
            if n:  # the first member took every shard from nobody
                # Only what the newcomer took for balance moved.
                assert moved == len(newcomer), [m.losses() for m in members]
            if shards == 1:
                assert moved == 0 and members[0].leading() == {0}, "a join took leadership from the leader"
        # A rolling restart: stop one (gracefully), start its replacement, settle, next.
        for n in range(3):
            leaving = members.pop(0)
            led = leaving.leading()
            moved, _ = moves(leaving.stop, f"after a member stopped (restart {n})")
            assert moved == 0, "a member leaving moved shards it did not lead"
            assert set(leaving.losses()) >= led  # what it led was handed over as it left
            moved, _ = moves(join, f"after its replacement joined (restart {n})")
            print(f"shards {shards}, {group_protocol}: restart {n}: {len(led)} shard(s) moved off the stopped "
                  f"member, {moved} to its replacement")
            assert moved == len(members[-1].leading())
            if shards == 1:
                assert moved == 0
    finally:
        for m in members:
            m.stop()


# --------------------------------------------------------------------- static membership


def reaper_config(tmp_path: Path, name: str, bootstrap: str, url: str, table: str, group: str,
                  instance_id: str, heartbeat_timeout: str = "2s") -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump({
        "harvest": {
            "baseKafkaConfig": {"bootstrap.servers": bootstrap}, "leaderGroupID": group,
            "dataSource": url, "outboxTable": table, "instanceID": instance_id,
            "limits": {"heartbeatTimeout": heartbeat_timeout, "minPollInterval": "50ms", "shutdownTimeout": "3s"},
        },
        "logging": {"level": "Info"},
    }))
    return path


def stash(url: str, table: str, topic: str, keys: range) -> None:
    import sqlalchemy as sa

    engine = sa.create_engine(url)
    try:
        with engine.begin() as conn:
            stasher.Stasher(table).prepare(conn).stash_many([OutboxRecord(topic, f"k{i}", f"v{i}".encode()) for i in keys])
    finally:
        engine.dispose()


@pytest.fixture
def apache_kafka() -> None:
    if on_embedded_broker():
        pytest.skip("static membership is proven on Apache Kafka")


def test_a_static_member_killed_and_restarted_publishes_again_with_nothing_lost(
    tmp_path, kafka_bootstrap, database_url, table_name, topic_name, apache_kafka
):
    create_outbox_table(database_url, table_name)
    create_topic(kafka_bootstrap, topic_name, partitions=2)
    group = f"static-{uuid.uuid4().hex[:8]}"
    # A long session: waiting for it (a dynamic member's restart) would show.
    path = reaper_config(tmp_path, "reaper", kafka_bootstrap, database_url, table_name, group, "reaper-0", "10s")
    first = Reaper(path, tmp_path / "first.log")
    reapers = [first]
    try:
        wait_until(first.is_leader, 60, "the static member to lead")
        stash(database_url, table_name, topic_name, range(100))
        wait_empty(database_url, table_name, 60)
        first.signal(signal.SIGKILL)
        first.wait(10)
        stash(database_url, table_name, topic_name, range(100, 200))  # waits for the next leader
        restarted_at = time.monotonic()
        second = Reaper(path, tmp_path / "second.log")
        reapers.append(second)
        wait_empty(database_url, table_name, 120)
        took = time.monotonic() - restarted_at
        print(f"static member killed and restarted: published again {took:.2f}s after the restart "
              "(session 30s)")
        assert "static member" in second.log()
        # Its hold counted from the killed process's last heartbeat, not from its own assignment.
        assert "its last heartbeat before this process" in second.log(), second.log()[-3000:]
    finally:
        stop_all(reapers)
    got = values_per_key(read_topic(kafka_bootstrap, topic_name, expect=200))
    missing = [i for i in range(200) if f"v{i}".encode() not in got.get(f"k{i}", [])]
    assert not missing, f"lost: {missing}"


def test_a_second_process_with_the_same_instance_id_is_fenced_naming_it(
    tmp_path, kafka_bootstrap, database_url, table_name, apache_kafka
):
    create_outbox_table(database_url, table_name)
    group = f"static-{uuid.uuid4().hex[:8]}"
    path = reaper_config(tmp_path, "reaper", kafka_bootstrap, database_url, table_name, group, "twin-0")
    older = Reaper(path, tmp_path / "older.log")
    reapers = [older]
    both: list[bool] = []
    try:
        wait_until(older.is_leader, 60, "the first process to lead")
        newer = Reaper(path, tmp_path / "newer.log")
        reapers.append(newer)

        def fenced_and_replaced() -> bool:
            both.append(older.is_leader() and newer.is_leader())
            return older.proc.poll() is not None and newer.is_leader()

        wait_until(fenced_and_replaced, 60, lambda: f"the older one to be fenced:\n{older.log()[-2000:]}",
                   interval=0.05)
        assert older.wait(10) != 0
        log = older.log()
        assert "with this reaper's instanceID (group.instance.id 'twin-0')" in log, log[-3000:]
        assert "Kafka fenced this older one, which stopped leading" in log
        assert log.count("lost leader status") >= 1  # stepped down before it stopped
        # The newcomer leads its first assignment once the older one has been told.
        terms = [line for line in newer.log().splitlines() if "elected leader" in line]
        assert len(terms) == 1
        stepped_down = next(line for line in log.splitlines() if "lost leader status" in line)
        # Log stamps, one clock: the older one stepped down before the newcomer led.
        assert stepped_down[:23] <= terms[0][:23], (stepped_down, terms[0])
        print(f"same instance id twice: both seen leading in {sum(both)} of {len(both)} samples of the logs")
    finally:
        stop_all(reapers)


def test_a_static_members_graceful_stop_hands_over_without_waiting_a_session(
    tmp_path, kafka_bootstrap, database_url, table_name, apache_kafka
):
    create_outbox_table(database_url, table_name)
    group = f"static-{uuid.uuid4().hex[:8]}"
    # Session 3 x 10 s: a static member that did not leave would hold the shard 30 s.
    paths = [reaper_config(tmp_path, f"r{n}", kafka_bootstrap, database_url, table_name, group, f"pod-{n}", "10s")
             for n in range(2)]
    reapers = [Reaper(paths[0], tmp_path / "r0.log")]
    try:
        wait_until(reapers[0].is_leader, 60, "the first to lead")
        reapers.append(Reaper(paths[1], tmp_path / "r1.log"))
        wait_until(settled({"bootstrap.servers": kafka_bootstrap}, group, 2), 60, "two members")
        assert reapers[0].is_leader() and not reapers[1].is_leader()  # the join took nothing
        reapers[0].signal(signal.SIGTERM)
        stopped = time.monotonic()
        assert reapers[0].wait(30) == 0, reapers[0].log()[-3000:]
        wait_until(reapers[1].is_leader, 20, "the standby to take over (a session is 30 s)", interval=0.02)
        print(f"static member's graceful stop: the standby led {time.monotonic() - stopped:.2f}s after SIGTERM")
    finally:
        stop_all(reapers)
