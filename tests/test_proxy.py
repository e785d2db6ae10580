"""The fault-injection proxy, against PostgreSQL and against a Kafka broker that
advertises it: every fault does what it says, healing undoes it, and stopping frees all."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest

from tests.helpers.faults.proxy import FaultProxy, FaultProxyError

psycopg = pytest.importorskip("psycopg")

# Who to log in as, filled in from the test database's URL by the ``pg`` fixture.
PG_LOGIN: dict[str, object] = {}


@pytest.fixture(scope="module")
def pg() -> tuple[str, int]:
    """The PostgreSQL server the suite uses (``PYHARVEST_TEST_POSTGRESQL_URL``, else the local
    one), skipped like every database test when it is not selected or not reachable."""
    import sqlalchemy as sa

    from tests.helpers.fixtures.databases import selected_dialects, server_url

    if "postgresql" not in selected_dialects():
        pytest.skip("postgresql is not in PYHARVEST_TEST_DATABASES")
    url = sa.make_url(server_url("postgresql"))
    PG_LOGIN.update(user=url.username or "postgres", dbname=url.database or "postgres")
    if url.password:
        PG_LOGIN["password"] = url.password
    return url.host or "127.0.0.1", url.port or 5432


@pytest.fixture
def proxy(pg: tuple[str, int]) -> Iterator[FaultProxy]:
    with FaultProxy(upstream=pg) as p:
        yield p


def connect(proxy: FaultProxy, connect_timeout: int = 3) -> psycopg.Connection:
    host, port = proxy.address
    return psycopg.connect(host=host, port=port, autocommit=True, connect_timeout=connect_timeout, **PG_LOGIN)


def one(conn: psycopg.Connection, sql: str = "SELECT 1") -> object:
    row = conn.execute(sql).fetchone()
    assert row is not None
    return row[0]


@pytest.mark.db
def test_forwards_and_counts(proxy):
    assert proxy.address[0] == "127.0.0.1"
    with connect(proxy) as conn:
        assert one(conn, "SELECT 40 + 2") == 42
        stats = proxy.stats
        assert stats.connections_accepted == 1 and stats.connections_active == 1
        assert stats.bytes_upstream > 0 and stats.bytes_downstream > 0


@pytest.mark.db
@pytest.mark.parametrize("fault", ["drop_connections", "reset_connections"])
def test_cut_connections_fail_the_next_query_and_new_ones_work(proxy, fault):
    conn = connect(proxy)
    assert one(conn) == 1
    getattr(proxy, fault)()
    with pytest.raises(psycopg.OperationalError):
        one(conn)
    assert conn.closed
    with connect(proxy) as again:
        assert one(again) == 1


@pytest.mark.db
def test_blackhole_hangs_a_query_until_the_client_gives_up_and_heal_releases_it(proxy):
    conn = connect(proxy)
    proxy.blackhole()
    result: list[object] = []
    worker = threading.Thread(target=lambda: result.append(one(conn, "SELECT 7")), daemon=True)
    started = time.monotonic()
    worker.start()
    worker.join(1.0)  # the client's timeout: nothing errors, nothing arrives
    assert worker.is_alive() and not result
    assert time.monotonic() - started >= 1.0
    # New connections are accepted but get nowhere either.
    with pytest.raises(psycopg.OperationalError, match="timeout"):
        connect(proxy, connect_timeout=1)  # libpq waits 2 s at least
    proxy.heal()  # what was held is delivered
    worker.join(5)
    assert result == [7]
    conn.close()


@pytest.mark.db
def test_drop_releases_a_blackholed_query(proxy):
    conn = connect(proxy)
    proxy.blackhole()
    errors: list[BaseException] = []

    def query() -> None:
        try:
            one(conn)
        except psycopg.OperationalError as e:
            errors.append(e)

    worker = threading.Thread(target=query, daemon=True)
    worker.start()
    worker.join(0.3)
    assert worker.is_alive()
    proxy.drop_connections()
    worker.join(5)
    assert len(errors) == 1
    assert proxy.stats.connections_active == 0


@pytest.mark.db
def test_refuse_turns_new_connections_away_but_keeps_current_ones(proxy):
    current = connect(proxy)
    proxy.refuse(True)
    with pytest.raises(psycopg.OperationalError, match="refused"):
        connect(proxy)
    assert one(current) == 1
    proxy.heal()
    with connect(proxy) as again:
        assert one(again) == 1
    current.close()


@pytest.mark.db
def test_latency_applies_per_chunk(proxy):
    with connect(proxy) as conn:
        proxy.set_latency(0.5)
        started = time.monotonic()
        one(conn)  # one chunk up, one chunk down
        assert time.monotonic() - started >= 1.0
        proxy.heal()
        started = time.monotonic()
        one(conn)
        assert time.monotonic() - started < 0.5  # healed: no chunk waits the latency (a bound a busy machine meets)
    with pytest.raises(ValueError):
        proxy.set_latency(-1)


@pytest.mark.db
def test_connections_are_bounded(pg):
    with FaultProxy(upstream=pg, max_connections=1) as p, connect(p) as first:
        with pytest.raises(psycopg.OperationalError):
            connect(p)
        assert one(first) == 1
        assert p.stats.connections_rejected == 1


def test_stop_frees_the_port_and_the_thread():
    threads = set(threading.enumerate())
    with socket.create_server(("127.0.0.1", 0)) as upstream:
        p = FaultProxy(upstream=upstream.getsockname()).start()
        port = p.port
        client = socket.create_connection(p.address)
        server_side, _ = upstream.accept()
        client.sendall(b"ping")
        assert server_side.recv(4) == b"ping"
        p.stop()
        p.stop()  # idempotent
        client.close()
        server_side.close()
    assert set(threading.enumerate()) <= threads
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    with socket.socket() as s:  # nothing lingers on the port: it can be bound again at once
        s.bind(("127.0.0.1", port))
    with pytest.raises(FaultProxyError, match="not started"):
        _ = p.address
    with pytest.raises(FaultProxyError, match="not running"):
        p.blackhole()


# ---------------------------------------------------------------------- Kafka, through the proxy


@pytest.mark.kafka
def test_kafka_through_the_proxy_blackhole_fails_delivery_and_heal_restores_it(topic_name):
    from confluent_kafka import Producer

    from tests.helpers.faults.kafka import proxied_broker
    from tests.helpers.topics import create_topic

    message_timeout = 3.0
    with proxied_broker() as (broker, proxy):
        assert broker.bootstrap_servers == f"127.0.0.1:{proxy.port}"
        create_topic(broker.bootstrap_servers, topic_name, partitions=1)
        producer = Producer(
            {"bootstrap.servers": broker.bootstrap_servers, "message.timeout.ms": int(message_timeout * 1000),
             "linger.ms": 0, "enable.idempotence": False}
        )
        reports: list[tuple[float, object]] = []

        def send(producer: Producer, value: bytes) -> None:
            reports.clear()
            producer.produce(topic_name, key=b"k", value=value,
                             on_delivery=lambda err, _m: reports.append((time.monotonic(), err)))

        send(producer, b"before")
        assert producer.flush(10) == 0 and reports[0][1] is None
        proxy.blackhole()
        sent_before = proxy.stats.bytes_upstream
        started = time.monotonic()
        send(producer, b"during")
        producer.flush(message_timeout + 5)
        [(at, err)] = reports
        assert err is not None and "timed out" in str(err).lower(), err
        assert at - started <= message_timeout + 1.0
        assert proxy.stats.bytes_upstream == sent_before  # nothing got through

        proxy.heal()
        send(producer, b"after")
        assert producer.flush(15) == 0
        assert reports[0][1] is None, reports
        assert proxy.stats.bytes_upstream > sent_before
        del producer  # before the proxy and broker go


@pytest.mark.kafka
def test_kafka_recipe_broker_advertises_the_proxy():
    """The metadata the broker hands out must name the proxy, or clients bypass it."""
    from confluent_kafka.admin import AdminClient

    from tests.helpers.faults.kafka import proxied_broker

    with proxied_broker() as (broker, proxy):
        md = AdminClient({"bootstrap.servers": broker.bootstrap_servers}).list_topics(timeout=10)
        assert {(b.host, b.port) for b in md.brokers.values()} == {("127.0.0.1", proxy.port)}
        assert broker.listener[1] != proxy.port
