"""Wake-up datagrams (``PYHARVEST_WAKE_ADDRESS``), where the database has no NOTIFY: the listener
and the stasher's send on commit on SQLite and plain sockets; then on a live MariaDB with Kafka,
a lone record published long before the idle pause would have found it, lost and duplicated
wake-ups, and a stasher with no reaper at all."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from pyharvest import OutboxRecord, stasher
from pyharvest.bindings.sql import create_outbox_table
from pyharvest.bindings.sql.change_feed import OutboxChangeFeed
from pyharvest.bindings.sql.wake_datagrams import (
    WAKE_ADDRESS_ENV,
    DatagramListener,
    datagram_listener,
    send_wake,
    sender_counts,
    wake_addresses,
)
from pyharvest.core.errors import ConfigError
from pyharvest.plugins.api import dialect_of, parse_table_name
from pyharvest.stasher import notify
from tests.helpers.fixtures.databases import server_url
from tests.helpers.topics import create_topic, read_topic
from tests.helpers.waiting import wait_until
from tests.helpers.wakeups import harvester, lead_and_idle, outbox_on, stash_one

# Far longer than any wake-up takes: a record published before this ran on a wake-up.
LONG_PAUSE = 30.0
OUTBOX = parse_table_name("outbox")


def free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def wake_address(monkeypatch: pytest.MonkeyPatch) -> str:
    address = f"127.0.0.1:{free_udp_port()}"
    monkeypatch.setenv(WAKE_ADDRESS_ENV, address)
    monkeypatch.setattr(notify, "NOTIFY_INTERVAL", 0.0)  # each transaction wakes, however soon after the last
    return address


# ----------------------------------------------------------------------------- no database


def test_addresses_are_parsed_and_a_malformed_one_is_refused():
    assert wake_addresses("") == ()
    assert wake_addresses("127.0.0.1:19301, reaper-b:19301,[::1]:5") == (
        ("127.0.0.1", 19301), ("reaper-b", 19301), ("::1", 5))
    for bad in ("127.0.0.1", "host:", ":19301", "host:0", "host:http"):
        with pytest.raises(ConfigError, match=WAKE_ADDRESS_ENV):
            wake_addresses(bad)


def test_unset_means_no_listener(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv(WAKE_ADDRESS_ENV, raising=False)
    assert datagram_listener(OUTBOX) is None
    monkeypatch.setenv(WAKE_ADDRESS_ENV, "")
    assert datagram_listener(OUTBOX) is None


def test_the_listener_wakes_on_its_outbox_only_and_counts_duplicates_once(wake_address: str):
    listener = DatagramListener(wake_addresses(wake_address), OUTBOX)
    try:
        assert not listener.wait(0.01)
        send_wake(parse_table_name("other"))
        assert not listener.wait(0.2)  # another outbox's wake-up
        for _ in range(5):
            send_wake(OUTBOX)
        assert listener.wait(5)
        # The duplicates came together and were drained with the first.
        assert not listener.wait(0.05)
    finally:
        listener.close()


def test_a_second_listener_takes_the_next_address(wake_address: str):
    second = f"127.0.0.1:{free_udp_port()}"
    addresses = wake_addresses(f"{wake_address},{second}")
    first = DatagramListener(addresses, OUTBOX)
    try:
        other = DatagramListener(addresses, OUTBOX)
        try:
            assert other.address == addresses[1]
            with pytest.raises(OSError, match=WAKE_ADDRESS_ENV):
                DatagramListener(addresses, OUTBOX)  # both taken: the change feed polls, and retries
        finally:
            other.close()
    finally:
        first.close()


def test_the_change_feed_listens_for_datagrams_where_the_dialect_cannot_listen(wake_address: str):
    """SQLite has no LISTEN: with the variable set its change feed wakes on datagrams."""
    engine = sa.create_engine("sqlite://")
    dialect = dialect_of(engine.dialect)
    assert dialect is not None
    feed = OutboxChangeFeed(engine, dialect, OUTBOX)
    woken: list[float] = []
    assert feed.supported
    stop = feed.watch(lambda: woken.append(time.monotonic()))
    assert stop is not None
    try:
        wait_until(lambda: feed.connected and woken)  # the wake-up after (re)connecting
        before = len(woken)
        send_wake(OUTBOX)
        wait_until(lambda: len(woken) > before)
    finally:
        stop()
        engine.dispose()


def test_the_databases_own_notifications_win_over_datagrams(wake_address: str):
    """A dialect that can listen (PostgreSQL) keeps its listener; the variable changes nothing."""
    own = object()

    class Listening:
        def listener(self, engine: object, table: object) -> object:
            return own

    feed = OutboxChangeFeed(sa.create_engine("sqlite://"), Listening(), OUTBOX)  # type: ignore[arg-type]
    assert feed._factory is own


class Receiver:
    """A bound socket counting the wake-ups that reach it."""

    def __init__(self, address: str) -> None:
        self.listener = DatagramListener(wake_addresses(address), OUTBOX)

    def woken(self, timeout: float = 0.2) -> bool:
        return self.listener.wait(timeout)

    def close(self) -> None:
        self.listener.close()


@pytest.fixture
def receiver(wake_address: str) -> Iterator[Receiver]:
    r = Receiver(wake_address)
    yield r
    r.close()


@pytest.fixture
def sqlite_outbox(tmp_path) -> Iterator[sa.Engine]:
    url = f"sqlite:///{tmp_path / 'wake.db'}"
    create_outbox_table(url, "outbox")
    engine = sa.create_engine(url)
    yield engine
    engine.dispose()


def test_the_stasher_sends_on_commit_and_not_on_rollback(sqlite_outbox: sa.Engine, receiver: Receiver):
    st = stasher.Stasher("outbox")
    with sqlite_outbox.connect() as conn:
        conn.begin()
        st.stash(conn, OutboxRecord("t", "k", b"rolled back"))
        conn.rollback()
        assert not receiver.woken()
        with conn.begin():
            st.stash(conn, OutboxRecord("t", "k", b"1"))
            st.stash(conn, OutboxRecord("t", "k", b"2"))
            assert not receiver.woken(0.05)  # not before the commit
        assert receiver.woken(5)
        assert not receiver.woken(0.05)  # one per transaction
        # A connection that has not begun: the stash begins the transaction its insert would.
        st.stash(conn, OutboxRecord("t", "k", b"3"))
        conn.commit()
        assert receiver.woken(5)


def test_the_async_stasher_sends_on_commit_too(tmp_path, receiver: Receiver):
    pytest.importorskip("aiosqlite")
    pytest.importorskip("greenlet", reason="SQLAlchemy's asyncio needs greenlet")
    from sqlalchemy.ext.asyncio import create_async_engine

    create_outbox_table(f"sqlite:///{tmp_path / 'wake.db'}", "outbox")

    async def main() -> None:
        engine = create_async_engine(f"sqlite+aiosqlite:///{tmp_path / 'wake.db'}")
        try:
            async with engine.connect() as conn:
                await conn.begin()
                await stasher.Stasher("outbox").astash(conn, OutboxRecord("t", "k", b"rolled back"))
                await conn.rollback()
                assert not receiver.woken()
                async with conn.begin():
                    await stasher.Stasher("outbox").astash(conn, OutboxRecord("t", "k", b"x"))
        finally:
            await engine.dispose()

    asyncio.run(main())
    assert receiver.woken(5)


def test_without_the_variable_the_stasher_sends_nothing(sqlite_outbox: sa.Engine, receiver: Receiver,
                                                        monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv(WAKE_ADDRESS_ENV)
    sent = sender_counts()
    with sqlite_outbox.begin() as conn:
        stasher.Stasher("outbox").stash(conn, OutboxRecord("t", "k", b"x"))
    assert sender_counts() == sent
    assert not receiver.woken()


# ----------------------------------------------------------------------------- MariaDB and Kafka


@pytest.fixture
def mysql_url() -> str:
    return server_url("mysql")


@pytest.fixture
def mysql_table(mysql_url: str) -> Iterator[str]:
    with outbox_on(mysql_url) as name:
        yield name


@pytest.mark.kafka
def test_a_lone_record_wakes_an_idle_harvester_on_mariadb(kafka_config, kafka_bootstrap, topic_name, mysql_url,
                                                          mysql_table, wake_address):
    create_topic(kafka_bootstrap, topic_name, 1)
    writer = sa.create_engine(mysql_url)
    try:
        with harvester(kafka_config, mysql_url, mysql_table, LONG_PAUSE) as h:
            lead_and_idle(h)
            assert h.health().change_feed_connected is True
            for i in range(3):
                marks = h.metrics.marks
                stash_one(writer, mysql_table, topic_name, b"%d" % i)
                # Only the wake-up explains it: the idle pause is LONG_PAUSE.
                wait_until(lambda n=i + 1: h.metrics.records_purged >= n, LONG_PAUSE / 3)
                assert h.metrics.marks - marks <= 20  # the ramp after a wake-up, not a poll every 10 ms
                wait_until(lambda: all(h.engines[s]._idle.pause >= 1.0 for s in h.leading_shards), 30)
    finally:
        writer.dispose()
    assert [m[2] for m in read_topic(kafka_bootstrap, topic_name, 3)] == [b"0", b"1", b"2"]


@pytest.mark.kafka
def test_lost_wake_ups_cost_only_the_poll(kafka_config, kafka_bootstrap, topic_name, mysql_url, mysql_table,
                                          wake_address, monkeypatch):
    """The datagram goes where nobody listens, and a plain INSERT sends none: polling finds both."""
    create_topic(kafka_bootstrap, topic_name, 1)
    writer = sa.create_engine(mysql_url)
    try:
        with harvester(kafka_config, mysql_url, mysql_table, 0.5) as h:
            lead_and_idle(h)
            assert h.health().change_feed_connected is True
            monkeypatch.setenv(WAKE_ADDRESS_ENV, f"127.0.0.1:{free_udp_port()}")  # the stasher's, from now on
            stash_one(writer, mysql_table, topic_name, b"lost")
            with writer.begin() as tx:
                tx.execute(sa.text(f"INSERT INTO {mysql_table} (kafka_topic, kafka_key, kafka_value, kafka_headers) "
                                   "VALUES (:t, 'k', 'plain', '[]')"), {"t": topic_name})
            wait_until(lambda: h.metrics.records_purged >= 2, 20)
    finally:
        writer.dispose()
    assert sorted(m[2] for m in read_topic(kafka_bootstrap, topic_name, 2)) == [b"lost", b"plain"]


@pytest.mark.kafka
def test_duplicated_wake_ups_are_harmless(kafka_config, kafka_bootstrap, topic_name, mysql_url, mysql_table,
                                          wake_address):
    create_topic(kafka_bootstrap, topic_name, 1)
    writer = sa.create_engine(mysql_url)
    table = parse_table_name(mysql_table)
    try:
        with harvester(kafka_config, mysql_url, mysql_table, LONG_PAUSE) as h:
            lead_and_idle(h)
            for _ in range(20):  # wake-ups for no rows
                send_wake(table)
            stash_one(writer, mysql_table, topic_name, b"once")
            for _ in range(20):  # and again, for rows already published
                send_wake(table)
            wait_until(lambda: h.metrics.records_purged >= 1, LONG_PAUSE / 3)
            # Back to idle: the duplicates cost a few empty marks, nothing else.
            wait_until(lambda: all(h.engines[s]._idle.pause >= 1.0 for s in h.leading_shards), 30)
            assert h.metrics.records_marked == 1
            assert h.metrics.mark_errors == 0
    finally:
        writer.dispose()
    assert [m[2] for m in read_topic(kafka_bootstrap, topic_name, 1)] == [b"once"]


def test_a_stasher_with_no_reaper_commits_as_ever(mysql_url, mysql_table, wake_address):
    """Nothing listens at the address: the commit succeeds, no error is raised or counted."""
    writer = sa.create_engine(mysql_url)
    sent, failed = sender_counts()
    try:
        for i in range(3):
            stash_one(writer, mysql_table, "no-reaper", b"%d" % i)
        with writer.connect() as c:
            assert c.execute(sa.text(f"SELECT COUNT(*) FROM {mysql_table}")).scalar_one() == 3
    finally:
        writer.dispose()
    assert sender_counts() == (sent + 3, failed)
