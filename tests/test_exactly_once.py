"""``delivery: exactly-once`` on Apache Kafka and live databases: what a ``read_committed``
consumer sees is every outbox record once, in order per key, whatever happens to the leaders.

The takeover's logic (progress read, purge of what already committed) is also tested in
isolation in tests/test_transactions.py; the chaos test with processes killed, stopped and
paused is tests/test_exactly_once_chaos.py.
"""

from __future__ import annotations

import uuid

import pytest

from pyharvest import Config, Harvest, Limits
from pyharvest.bindings.sql import create_outbox_table
from pyharvest.core.errors import HarvestError
from tests.helpers.fixtures.kafka import on_embedded_broker
from tests.helpers.outbox import outbox_count, wait_empty, write_concurrently
from tests.helpers.topics import create_topic, read_topic, values_per_key
from tests.helpers.waiting import wait_until

pytestmark = [pytest.mark.kafka, pytest.mark.db]


def eos_config(bootstrap: str, url: str, table: str, **kw) -> Config:
    return Config(
        base_kafka_config={"bootstrap.servers": bootstrap},
        leader_group_id=f"eos-{uuid.uuid4().hex[:8]}",
        data_source=url,
        outbox_table=table,
        delivery="exactly-once",
        limits=Limits(heartbeat_timeout=2.0, min_poll_interval=0.05),
        **kw,
    )


@pytest.fixture
def apache_bootstrap(kafka_bootstrap: str) -> str:
    if on_embedded_broker():
        pytest.skip("the embedded broker has no transactions (tested: it is refused with a clear error)")
    return kafka_bootstrap


@pytest.mark.parametrize("shards", [1, 3])
def test_every_record_exactly_once_in_order(shards, apache_bootstrap, database_url, table_name, topic_name):
    create_outbox_table(database_url, table_name, shards=shards)
    create_topic(apache_bootstrap, topic_name, partitions=4)
    harvest = Harvest(eos_config(apache_bootstrap, database_url, table_name, shards=shards))
    harvest.start()
    try:
        expected = write_concurrently(database_url, table_name, topic_name, writers=4, per_writer=500, keys=53)
        wait_empty(database_url, table_name)
    finally:
        harvest.stop()
        assert harvest.join(30)
    total = sum(len(v) for v in expected.values())
    got = read_topic(apache_bootstrap, topic_name, expect=total)
    per_key = values_per_key(got)
    assert len(got) == total, f"{len(got) - total} duplicates"
    for key, values in expected.items():
        assert per_key[key] == values, f"order, loss or a duplicate for {key}"
    engines = harvest.engines.values()
    assert sum(e.metrics.transactions_committed for e in engines) >= shards
    assert sum(e.metrics.records_purged for e in engines) == total


@pytest.mark.parametrize("delivery", ["exactly-once", "at-least-once"])
def test_a_new_leader_purges_what_the_last_transaction_committed(
    delivery, apache_bootstrap, database_url, table_name, topic_name
):
    """The leader dies between Kafka's commit and its purge: the rows are still in the table,
    and the next leader must purge them from the progress record, not publish them again.
    At least once, the same death publishes them twice: the test can tell."""
    create_outbox_table(database_url, table_name)
    create_topic(apache_bootstrap, topic_name, partitions=1)
    config = eos_config(apache_bootstrap, database_url, table_name)
    config.delivery = delivery
    expected = write_concurrently(database_url, table_name, topic_name, writers=1, per_writer=200, keys=7)
    first = Harvest(config)
    engine = first.runner
    purges: list[int] = []

    def dies_before_purging(ids):
        purges.append(len(ids))
        raise ConnectionError("the leader died before its purge")

    first.start()
    try:
        wait_until(lambda: engine.binding is not None, 30, "the first harvester opened its binding")
        binding = engine.binding
        binding.purge = dies_before_purging  # type: ignore[method-assign]
        wait_until(lambda: purges, 60, "a purge of published records")
    finally:
        first.stop()
        assert first.join(30)
    second = Harvest(config)
    with second:
        wait_empty(database_url, table_name)
    total = sum(len(v) for v in expected.values())
    got = read_topic(apache_bootstrap, topic_name, expect=total)
    per_key = values_per_key(got)
    if delivery == "at-least-once":
        assert len(got) >= total + purges[0], "the published but unpurged records came twice"
        return
    assert len(got) == total, f"{len(got) - total} duplicates"
    for key, values in expected.items():
        assert per_key[key] == values


def test_the_embedded_broker_is_refused_with_a_clear_error(embedded_bootstrap, database_url, table_name):
    create_outbox_table(database_url, table_name)
    harvest = Harvest(eos_config(embedded_bootstrap, database_url, table_name))
    with pytest.raises(HarvestError, match="exactly-once needs a Kafka cluster with transactions"):
        harvest.start()


# ---------------------------------------------------------------- the old leader's commit races the new leader's fence


class Lease:
    """Leader election under the test's control: a deposed leader that does not know it yet
    (paused, partitioned) is a lease nobody revokes."""

    def __init__(self, on_status) -> None:
        self._on_status = on_status
        self._pending = None
        self.leading = False

    def acquire(self) -> None:
        from pyharvest.core.election.lease import LeaderStatus

        self._pending = LeaderStatus.ACQUIRED

    def start(self) -> None:
        pass

    def pulse(self) -> bool:
        status, self._pending = self._pending, None
        if status is not None:
            self.leading = True
            self._on_status(status)
        return self.leading

    def poll_due(self) -> float:
        return 0.02

    broker_error = None

    def leaders(self) -> dict:
        return {}

    @property
    def since_last_poll(self) -> float:
        return 0.0

    @property
    def broker_connected(self) -> bool:
        return True

    def close(self) -> None:
        pass


def leader(config: Config, clients, leases: list):
    from pyharvest._harvest import _sql_binding
    from pyharvest.core.engine.harvest import HarvestEngine

    def lease(on_status):
        leases.append(Lease(on_status))
        return leases[-1]

    return HarvestEngine(config, binding=_sql_binding(config), kafka=clients, leadership=lease)


def test_rows_another_leader_marks_again_are_not_published_twice(
    apache_bootstrap, database_url, table_name, topic_name
):
    """A deposed leader that has not noticed yet goes on marking: it takes rows this leader
    has committed and not yet purged, and this leader's next mark takes them back. They must
    not go out in a second transaction (read ``read_committed``, each record once)."""
    import sqlalchemy as sa

    from pyharvest.bindings.kafka.transactions import ConfluentTransactionalClients

    create_outbox_table(database_url, table_name)
    create_topic(apache_bootstrap, topic_name, partitions=2)
    config = eos_config(apache_bootstrap, database_url, table_name)
    expected = write_concurrently(database_url, table_name, topic_name, writers=1, per_writer=300, keys=11)
    total = sum(len(v) for v in expected.values())
    engine = sa.create_engine(database_url)
    outbox = sa.table(table_name, sa.column("leader_id"))
    other = "another-leader"

    def another_leaders(where: sa.ColumnElement[bool]) -> int:
        with engine.begin() as c:
            return c.execute(sa.select(sa.func.count()).select_from(outbox).where(where)).scalar_one()

    leases: list = []
    harvest = leader(config, ConfluentTransactionalClients(), leases)
    remarked = []
    harvest.start()
    try:
        wait_until(lambda: harvest.binding is not None, 30, "the leader's binding")
        purge = harvest.binding.purge

        def purge_after_another_leaders_mark(ids):
            if not remarked:  # the first committed transaction's purge: everything is in it
                with engine.begin() as c:
                    remarked.append(c.execute(sa.update(outbox).values(leader_id=other)).rowcount)
                wait_until(
                    lambda: another_leaders(outbox.c.leader_id == other) == 0,
                    60,
                    "the leader's mark to take back the rows another leader marked",
                )
            return purge(ids)

        harvest.binding.purge = purge_after_another_leaders_mark  # type: ignore[method-assign]
        leases[0].acquire()
        wait_until(lambda: outbox_count(database_url, table_name) == 0, 90, "the leader to drain the outbox")
    finally:
        harvest.stop()
        harvest.join(30)
        engine.dispose()
    assert remarked == [total]
    got = read_topic(apache_bootstrap, topic_name, expect=total)
    assert len(got) == total, f"{len(got) - total} duplicates"
    per_key = values_per_key(got)
    for key, values in expected.items():
        assert per_key[key] == values


@pytest.mark.parametrize("winner", ["fence", "commit"])
def test_the_old_leaders_commit_racing_the_new_leaders_fence(
    winner, apache_bootstrap, database_url, table_name, topic_name
):
    """The old leader is held between its produce and its commit (``fence``: the new leader
    fences it meanwhile, and its commit is then refused) or between its commit and its purge
    (``commit``: the new leader must purge what it committed). Either way each record is read
    once, in order, and the outbox ends empty."""
    import threading

    from pyharvest.bindings.kafka.transactions import ConfluentTransactionalClients as ConfluentClients

    create_outbox_table(database_url, table_name)
    create_topic(apache_bootstrap, topic_name, partitions=2)
    config = eos_config(apache_bootstrap, database_url, table_name)
    expected = write_concurrently(database_url, table_name, topic_name, writers=1, per_writer=300, keys=11)
    total = sum(len(v) for v in expected.values())
    held, release = threading.Event(), threading.Event()

    class HeldClients(ConfluentClients):
        """The old leader's clients: its first commit (``fence``) waits for the test."""

        def transactional_producer(self, cfg):
            producer = super().transactional_producer(cfg)
            commit = producer.commit_transaction

            def held_commit(timeout):
                if winner == "fence" and not held.is_set():
                    held.set()
                    release.wait(60)
                commit(timeout)

            producer.commit_transaction = held_commit
            return producer

    old_leases: list = []
    old = leader(config, HeldClients(), old_leases)
    old.start()
    new_leases: list = []
    new = leader(config, ConfluentClients(), new_leases)
    try:
        if winner == "commit":
            wait_until(lambda: old.binding is not None, 30, "the old leader's binding")
            purge = old.binding.purge

            def held_purge(ids):
                if not held.is_set():
                    held.set()
                    release.wait(60)
                return purge(ids)

            old.binding.purge = held_purge  # type: ignore[method-assign]
        old_leases[0].acquire()
        wait_until(held.is_set, 60, f"the old leader to reach its {'commit' if winner == 'fence' else 'purge'}")
        new.start()
        new_leases[0].acquire()
        wait_until(lambda: outbox_count(database_url, table_name) == 0, 90, "the new leader to drain the outbox")
        new.stop()
        assert new.join(30)
        release.set()
        if winner == "fence":
            wait_until(lambda: old.metrics.producer_fencings >= 1, 60, "the old leader's commit to be refused")
            assert old.metrics.transactions_committed == 0
    finally:
        release.set()
        new.stop()
        old.stop()
        old.join(30)
        new.join(30)
    got = read_topic(apache_bootstrap, topic_name, expect=total)
    per_key = values_per_key(got)
    assert len(got) == total, f"{len(got) - total} duplicates"
    for key, values in expected.items():
        assert per_key[key] == values
