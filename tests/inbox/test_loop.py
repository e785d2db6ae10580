"""The worker's loop and the wired Inbox, on a SQLite file with Kafka faked: when a batch
commits, how a database error is recovered from, and the lifecycle without a broker."""

from __future__ import annotations

import time
from typing import ClassVar

import pytest
import sqlalchemy as sa
from sqlalchemy.exc import DBAPIError

from pyharvest.errors import HandlerError
from pyharvest.inbox import Inbox, InboxConfig, InboxLimits
from tests.helpers.inbox.fakes import GROUP, TOPIC, FakeConfluentConsumer, Stores, kafka_message, message, wire
from tests.helpers.waiting import wait_until


@pytest.fixture
def stores(tmp_path) -> Stores:
    s = Stores.create(str(tmp_path / "inbox.db"))
    yield s
    s.engine.dispose()


def test_a_batch_gathers_until_full_then_commits(stores):
    parts = wire(stores, max_batch=3, max_duration=60.0)
    c = parts.ports.consumer
    c.rebalance("assign", [(TOPIC, 0)])
    c.deliver(message(0), message(1))
    parts.loop.step()
    assert parts.batches.open is not None and stores.checkpoint()[0] is None
    c.deliver(message(2), message(3))
    parts.loop.step()
    assert c.polls[0][0] == 3 and c.polls[1][0] == 1, "the open batch asks only for the room it has left"
    assert 0 < c.polls[1][1] <= 60.0, "and waits no longer than its duration allows"
    assert stores.checkpoint()[0] == 3 and stores.applied_offsets() == [0, 1, 2]
    parts.loop.step()
    assert parts.batches.open is not None, "offset 3 opened the next batch"


def test_a_batch_commits_once_its_duration_is_up(stores):
    parts = wire(stores, max_batch=1000, max_duration=0.0)
    parts.ports.consumer.rebalance("assign", [(TOPIC, 0)])
    parts.ports.consumer.deliver(message(0))
    parts.loop.step()
    assert parts.batches.open is None and stores.checkpoint()[0] == 1


def test_a_database_error_is_recovered_from_on_the_next_steps(stores):
    lost = DBAPIError("SELECT 1", {}, Exception("server closed the connection"), connection_invalidated=True)
    failures = [lost]

    def handler(tx, m):
        if failures:
            raise failures.pop()
        stores.record(tx, m)

    parts = wire(stores, handler, max_batch=2)
    parts.ports.consumer.rebalance("assign", [(TOPIC, 0)])
    parts.ports.consumer.deliver(message(0), message(1))
    parts.loop.step()
    assert parts.counters.snapshot(()).database_errors == 1
    assert [m.offset for m in parts.batches.redo] == [0, 1]
    parts.loop.step()
    parts.loop.step()
    assert stores.applied_offsets() == [0, 1] and stores.checkpoint()[0] == 2


class SlowFake(FakeConfluentConsumer):
    """Waits a little when there is nothing, like a real poll, so the worker does not spin."""

    instances: ClassVar[list[SlowFake]] = []

    def __init__(self, conf):
        super().__init__(conf)
        SlowFake.instances.append(self)

    def consume(self, num_messages=1, timeout=-1):
        got = super().consume(num_messages, timeout)
        if not got:
            time.sleep(min(max(timeout, 0), 0.01))
        return got


def config(tmp_path, **kw) -> InboxConfig:
    return InboxConfig(
        base_kafka_config={"bootstrap.servers": "unused:9092"},
        group_id=GROUP,
        topics=[TOPIC],
        data_source=f"sqlite:///{tmp_path / 'inbox.db'}",
        checkpoint_table="unit_cp",
        dedupe_table="unit_dd",
        dead_letter_table="unit_dl",
        limits=InboxLimits(max_batch_duration=0.01, poll_duration=0.01, replay_poll_interval=0.05),
        **kw,
    )


def test_the_inbox_runs_the_parts_without_a_broker(tmp_path, stores):
    SlowFake.instances.clear()
    inbox = Inbox(config(tmp_path), stores.record, engine=stores.engine, consumer_factory=SlowFake)
    with inbox:
        wait_until(lambda: SlowFake.instances, 10, "the consumer")
        fake = SlowFake.instances[0]
        assert fake.conf["group.id"] == GROUP and fake.topics == [TOPIC]
        fake.rebalance("assign", [(TOPIC, 0)])
        wait_until(lambda: inbox.stats.assigned == ((TOPIC, 0),), 10, "the assignment")
        fake.deliver(*(kafka_message(0, i, value=str(i).encode(), source=("o", i)) for i in range(5)))
        wait_until(lambda: inbox.stats.applied == 5, 10, "five applied")
        assert inbox.running
    assert not inbox.running and inbox.stats.assigned == ()
    assert fake.closed
    assert stores.applied_offsets() == [0, 1, 2, 3, 4] and stores.checkpoint()[0] == 5
    assert fake.commits and fake.commits[-1] == [(TOPIC, 0, 5)]
    stats = inbox.stats
    assert (stats.applied, stats.commits >= 1, stats.rollbacks) == (5, True, 0)


def test_the_inbox_reports_what_stopped_it_through_join(tmp_path, stores):
    def failing(tx, m):
        raise ValueError("no")

    SlowFake.instances.clear()
    inbox = Inbox(config(tmp_path), failing, engine=stores.engine, consumer_factory=SlowFake).start()
    wait_until(lambda: SlowFake.instances, 10, "the consumer")
    SlowFake.instances[0].rebalance("assign", [(TOPIC, 0)])
    SlowFake.instances[0].deliver(kafka_message(0, 0))
    with pytest.raises(HandlerError, match="ValueError: no"):
        inbox.join(10)
    assert SlowFake.instances[0].closed
    with stores.engine.connect() as c:
        assert c.execute(sa.select(sa.func.count()).select_from(stores.applied)).scalar_one() == 0
