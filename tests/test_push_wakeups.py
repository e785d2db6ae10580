"""Push wake-ups on a live PostgreSQL: a stashed record wakes an idle harvester at once; without
a notification polling still finds it; the LISTEN connection is reported by /readyz and comes
back after its backend is killed. On MariaDB and SQLite an idle harvester backs off and records
still flow."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from pyharvest import Config, Harvest, Limits, OutboxRecord, stasher
from pyharvest.bindings.sql import create_outbox_table
from pyharvest.plugins import postgresql
from pyharvest.plugins.api import parse_table_name
from pyharvest.stasher import notify
from pyharvest.stasher.notify import wake_harvester
from tests.helpers.fixtures.databases import server_url, unique_table
from tests.helpers.topics import create_topic, read_topic
from tests.helpers.waiting import wait_until
from tests.helpers.wakeups import harvester, idle, lead_and_idle, outbox_on, stash_one

pytestmark = pytest.mark.kafka

# Far longer than any wake-up takes: a record published before this ran on a notification.
LONG_PAUSE = 30.0


@pytest.fixture
def pg_url() -> str:
    return server_url("postgresql")


@pytest.fixture
def pg_table(pg_url: str) -> Iterator[str]:
    with outbox_on(pg_url) as name:
        yield name


def published_within(h: Harvest, count: int, since: float, timeout: float) -> float:
    wait_until(lambda: h.metrics.records_purged >= count, timeout)
    return time.monotonic() - since


def test_a_stashed_record_wakes_an_idle_harvester(kafka_config, kafka_bootstrap, topic_name, pg_url, pg_table,
                                                  monkeypatch):
    monkeypatch.setattr(notify, "NOTIFY_INTERVAL", 0.0)  # each record notifies, however soon after the last
    create_topic(kafka_bootstrap, topic_name, 1)
    writer = sa.create_engine(pg_url)
    try:
        with harvester(kafka_config, pg_url, pg_table, LONG_PAUSE) as h:
            lead_and_idle(h)
            assert h.health().change_feed_connected is True
            for i in range(3):
                took = published_within(h, i + 1, stash_one(writer, pg_table, topic_name, b"%d" % i), LONG_PAUSE / 2)
                assert took < LONG_PAUSE / 3
            marks = h.metrics.marks
            # Idle again: the pause grows from 10 ms past a second, in a few marks (about 12 in
            # the first 0.1 s, then one per doubling), not 100 a second.
            wait_until(lambda: idle(h), 30, "the pause between empty marks to grow again")
            assert h.metrics.marks - marks <= 30
    finally:
        writer.dispose()
    assert [m[2] for m in read_topic(kafka_bootstrap, topic_name, 3)] == [b"0", b"1", b"2"]


def test_a_lost_notification_costs_at_most_one_pause(kafka_config, kafka_bootstrap, topic_name, pg_url, pg_table):
    """A row written without a notification (here: a plain INSERT) is found by polling."""
    create_topic(kafka_bootstrap, topic_name, 1)
    writer = sa.create_engine(pg_url)
    try:
        with harvester(kafka_config, pg_url, pg_table, 0.5) as h:
            lead_and_idle(h)
            with writer.begin() as tx:
                tx.execute(sa.text(f"INSERT INTO {pg_table} (kafka_topic, kafka_key, kafka_value) VALUES (:t, 'k', 'x')"),
                           {"t": topic_name})
            published_within(h, 1, time.monotonic(), 20)
    finally:
        writer.dispose()


def test_without_listen_the_harvester_polls(kafka_config, kafka_bootstrap, topic_name, pg_url, pg_table, monkeypatch):
    """A driver that cannot listen (psycopg older than 3.2): no change feed, records still flow."""
    monkeypatch.setattr(postgresql, "_listens_with_timeout", lambda: False)
    create_topic(kafka_bootstrap, topic_name, 1)
    writer = sa.create_engine(pg_url)
    try:
        with harvester(kafka_config, pg_url, pg_table, 0.5) as h:
            lead_and_idle(h)
            assert h.health().change_feed_connected is None
            published_within(h, 1, stash_one(writer, pg_table, topic_name, b"polled"), 20)
    finally:
        writer.dispose()


def listen_backends(engine: sa.Engine, table: str) -> list[int]:
    channel = postgresql.notify_channel(parse_table_name(table))
    with engine.connect() as c:
        return list(c.execute(sa.text(
            "SELECT pid FROM pg_stat_activity WHERE query = :q AND pid <> pg_backend_pid()"
        ), {"q": f'LISTEN "{channel}"'}).scalars())


def test_the_listen_connection_is_reported_and_reconnects(kafka_config, kafka_bootstrap, topic_name, pg_url, pg_table):
    from pyharvest.bindings.ops import start_ops_server
    from tests.helpers.ops import probe, scrape

    create_topic(kafka_bootstrap, topic_name, 1)
    admin = sa.create_engine(pg_url)
    try:
        with harvester(kafka_config, pg_url, pg_table, LONG_PAUSE) as h:
            ops = start_ops_server(h, {"port": 0, "address": "127.0.0.1"})
            assert ops is not None
            try:
                lead_and_idle(h)
                status, body = probe(ops, "/readyz")
                assert status == 200 and body["change_feed_connected"] is True
                assert scrape(ops)["pyharvest_change_feed_connected"] == 1
                feed = h.binding.change_feed  # type: ignore[union-attr]
                (pid,) = listen_backends(admin, pg_table)
                with admin.connect() as c:
                    assert c.execute(sa.text("SELECT pg_terminate_backend(:p)"), {"p": pid}).scalar_one()
                wait_until(lambda: feed.connects >= 2, 20)  # re-established
                assert probe(ops, "/readyz")[1]["change_feed_connected"] is True
                (new_pid,) = listen_backends(admin, pg_table)
                assert new_pid != pid
                wait_until(lambda: idle(h), 30, "the pause between empty marks to grow again")
                took = published_within(h, 1, stash_one(admin, pg_table, topic_name, b"after"), LONG_PAUSE / 2)
                assert took < LONG_PAUSE / 3
            finally:
                ops.stop()
    finally:
        admin.dispose()


def test_a_transaction_notifies_at_most_once_and_only_after_a_quiet_spell(pg_url, pg_table, monkeypatch):
    monkeypatch.setattr(notify, "NOTIFY_INTERVAL", 1.0)  # "quiet" long enough not to depend on speed
    engine = sa.create_engine(pg_url)
    table = parse_table_name(pg_table)
    listener = postgresql.PsycopgListener(engine, postgresql.notify_channel(table))
    try:
        def notifications() -> int:
            n = 0
            while listener.wait(0.3):
                n += 1
            return n

        with engine.begin() as tx:
            for _ in range(3):
                wake_harvester(tx, table, interval=0)
        assert notifications() == 1
        with engine.begin() as tx:  # the process stashed a moment ago: no notification
            wake_harvester(tx, table, interval=60)
        assert notifications() == 0
        with engine.connect() as c:  # rolled back: none delivered
            wake_harvester(c, table, interval=0)
            c.rollback()
        assert notifications() == 0
        # A quiet spell: the last stash's time, as the stasher noted it, moved back past the interval.
        notify._last[engine][table] -= 1.1
        for _ in range(5):  # a busy writer: only the first transaction, after a quiet spell, notifies
            with engine.begin() as tx:
                for _ in range(3):
                    stasher.Stasher(pg_table).stash(tx, OutboxRecord("t", "k", b"v"))
        assert notifications() == 1
    finally:
        listener.close()
        engine.dispose()


def test_channel_names_are_bounded_and_ignore_the_schema():
    assert postgresql.notify_channel(parse_table_name("app.outbox")) == "pyharvest_outbox.outbox"
    assert postgresql.notify_channel(parse_table_name("Outbox")) == "pyharvest_outbox.outbox"
    long_a, long_b = parse_table_name("o" * 62 + "a"), parse_table_name("o" * 62 + "b")
    assert len(postgresql.notify_channel(long_a)) <= 63
    assert postgresql.notify_channel(long_a) != postgresql.notify_channel(long_b)


@pytest.mark.parametrize("dialect", ["mysql", "sqlite"])
def test_other_databases_back_off_when_idle_and_records_still_flow(
    dialect, kafka_config, kafka_bootstrap, topic_name, tmp_path
):
    url = f"sqlite:///{tmp_path / 'outbox.db'}" if dialect == "sqlite" else server_url(dialect)
    table = unique_table()
    create_outbox_table(url, table)
    create_topic(kafka_bootstrap, topic_name, 1)
    writer = sa.create_engine(url)
    try:
        with harvester(kafka_config, url, table, 0.5) as h:
            lead_and_idle(h)
            assert h.health().change_feed_connected is None
            marks, since = h.metrics.marks, time.monotonic()
            wait_until(lambda: h.metrics.marks >= marks + 4, 30, "four more empty marks")
            # Three whole pauses at least between the four: 1.5 s at a 0.5 s pause, not 30 ms at 10 ms.
            assert time.monotonic() - since >= 1.4
            published_within(h, 1, stash_one(writer, table, topic_name, b"polled"), 20)
    finally:
        with writer.begin() as c:
            c.execute(sa.text(f"DROP TABLE {table}"))
        writer.dispose()


def test_the_shards_of_an_outbox_share_one_listening_connection(kafka_config, kafka_bootstrap, topic_name, pg_url,
                                                                monkeypatch):
    from pyharvest import Harvest

    monkeypatch.setattr(notify, "NOTIFY_INTERVAL", 0.0)  # each transaction notifies, however soon after the last
    table = unique_table()
    create_outbox_table(pg_url, table, shards=2)
    create_topic(kafka_bootstrap, topic_name, 2)
    writer = sa.create_engine(pg_url)
    config = Config(
        base_kafka_config=dict(kafka_config), leader_group_id=f"push-{uuid.uuid4().hex[:8]}", data_source=pg_url,
        outbox_table=table, shards=2,
        limits=Limits(heartbeat_timeout=2.0, min_poll_interval=0.05, mark_backoff=0.01, max_mark_backoff=LONG_PAUSE),
    )
    try:
        with Harvest(config) as h:
            wait_until(lambda: len(h.leading_shards) == 2)
            wait_until(lambda: idle(h), 30, "both shards' pauses between empty marks to grow")
            assert h.health().change_feed_connected is True
            assert len(listen_backends(writer, table)) == 1
            started = time.monotonic()
            for key in ("a", "b", "c", "d"):  # keys of both shards
                with writer.begin() as tx:
                    stasher.Stasher(table).stash(tx, OutboxRecord(topic_name, key, b"v"))
            wait_until(lambda: sum(e.metrics.records_purged for e in h.engines.values()) == 4, LONG_PAUSE / 2)
            assert time.monotonic() - started < LONG_PAUSE / 3
    finally:
        with writer.begin() as c:
            c.execute(sa.text(f"DROP TABLE {table}"))
        writer.dispose()
