"""Network and process faults, injected with the loopback fault proxy (PostgreSQL: none of
these scenarios depends on the dialect).

* the broker link is cut while records are in flight: deliveries fail, rows are reset and
  remarked; nothing is lost, order holds, and retriable errors never quarantine a key;
* the leader's broker link is black-holed for longer than ``heartbeatTimeout``: it fences
  itself (``LeaderFenced``), a second harvester takes over, and the old one publishes
  nothing after fencing;
* the database connection is dropped during marks and purges: marks are redone under a new
  leader id (``LeaderRefreshed``), purges are retried, no row stays marked forever;
* the leader process is SIGKILLed with a full in-flight window: the next leader salvages it.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
import uuid
from pathlib import Path

import pytest
import sqlalchemy as sa
import yaml

from pyharvest import Harvest
from pyharvest.bindings.sql import create_outbox_table
from pyharvest.core.telemetry.events import LeaderAcquired, LeaderFenced, LeaderRefreshed
from tests.helpers.faults.kafka import proxied_broker
from tests.helpers.faults.proxy import FaultProxy, _Conn
from tests.helpers.fixtures.kafka import on_embedded_broker
from tests.helpers.groups import settled
from tests.helpers.outbox import Writer, marked_count, outbox_count
from tests.helpers.reapers import Reaper, check_topic, config
from tests.helpers.topics import create_topic
from tests.helpers.waiting import wait_until

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(240)]


@pytest.fixture
def pg_url(dialect: str, database_url: str) -> str:
    if dialect != "postgresql":
        pytest.skip("fault scenarios are dialect-independent: PostgreSQL covers them")
    return database_url



# ---------------------------------------------------------------------- broker cut


def flowing(h: Harvest, records: int, timeout: float = 60.0) -> None:
    """Wait until ``h`` has published ``records`` more records: the stream flows."""
    published = h.metrics.records_published
    wait_until(lambda: h.metrics.records_published >= published + records, timeout, f"{records} more records published")


def test_broker_cut_with_records_in_flight_loses_nothing_and_keeps_order(pg_url, table_name, topic_name):
    create_outbox_table(pg_url, table_name)
    with proxied_broker() as (broker, proxy):
        create_topic(broker.bootstrap_servers, topic_name, partitions=4)
        # Retriable errors must never quarantine, however many there are.
        cfg = config(
            broker.bootstrap_servers, pg_url, table_name, poison_policy="quarantine",
            producer_kafka_config={"delivery.timeout.ms": 2000},
            limits={"max_delivery_attempts": 1},
        )
        events: list[object] = []
        writer = Writer(pg_url, table_name, topic_name)
        h = Harvest(cfg)
        h.set_event_handler(events.append)
        with h:
            wait_until(lambda: h.is_leader, 30, "leadership")
            writer.start()
            proxy.set_latency(0.05)  # keep a window of records in flight
            # Two cuts of the same producer on Apache Kafka; one on the embedded broker, where a
            # second cut livelocked the engine on PRODUCER_FENCED (the broker's epoch handling).
            for _ in range(1 if on_embedded_broker() else 2):
                flowing(h, 200)
                wait_until(lambda: h.in_flight_records > 0, 10, "records in flight")
                failed = sum(h.metrics.delivery_errors.values())
                proxy.refuse(True)
                proxy.reset_connections()
                # Refused until delivery.timeout.ms has passed: in-flight deliveries fail.
                wait_until(lambda failed=failed: sum(h.metrics.delivery_errors.values()) > failed, 30, "in-flight deliveries to fail")
                proxy.refuse(False)
            proxy.heal()
            flowing(h, 200)
            writer.stop()
            wait_until(lambda: outbox_count(pg_url, table_name) == 0, 40, "the outbox to drain")
        assert h.metrics.records_reset > 0 or sum(h.metrics.delivery_errors.values()) > 0, h.metrics
        assert h.metrics.records_quarantined == 0
        assert any(isinstance(e, (LeaderRefreshed, LeaderAcquired)) for e in events)
        check_topic(broker.bootstrap_servers, topic_name, writer.expected)


# ---------------------------------------------------------------------- black-holed leader


def _socket_ports_of(pid: int) -> set[int]:
    """Local TCP ports of the sockets process ``pid`` holds (from /proc)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    ports = set()
    for path in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(path).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            parts = line.split()
            if len(parts) > 9 and parts[9] in inodes:
                ports.add(int(parts[1].rsplit(":", 1)[1], 16))
    return ports


class IsolatingProxy(FaultProxy):
    """A fault proxy that can black-hole the connections of one process only (its peers'
    ports matched against ``/proc``), so that two harvesters behind one advertised broker
    address see different networks."""

    def __init__(self, *a, **kw) -> None:
        super().__init__(*a, **kw)
        self._isolated_pid: int | None = None
        self._gates: dict[_Conn, asyncio.Event] = {}

    def _is_isolated(self, conn: _Conn) -> bool:
        if self._isolated_pid is None:
            return False
        peer = conn.client.get_extra_info("peername")
        return peer is not None and peer[1] in _socket_ports_of(self._isolated_pid)

    def isolate(self, pid: int | None) -> None:
        """Black-hole every connection of ``pid`` (``None``: release them)."""

        async def apply() -> None:
            self._isolated_pid = pid
            for conn, gate in self._gates.items():
                if pid is not None and self._is_isolated(conn):
                    gate.clear()
                else:
                    gate.set()

        self._call(apply())

    def reset_isolated(self) -> None:
        """Abort (RST) the isolated process's connections: the partition ends with them dead."""

        async def apply() -> None:
            for conn, gate in list(self._gates.items()):
                if not gate.is_set():
                    conn.kill(rst=True)

        self._call(apply())

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = _Conn(writer, asyncio.current_task())
        gate = asyncio.Event()
        self._gates[conn] = gate
        if not self._is_isolated(conn):
            gate.set()
        self._conns.add(conn)
        try:
            await gate.wait()
            up_reader, up_writer = await asyncio.wait_for(asyncio.open_connection(*self.upstream), self.connect_timeout)
            conn.upstream = up_writer
            conn.tasks = [
                asyncio.create_task(self._gated_pump(reader, up_writer, gate)),
                asyncio.create_task(self._gated_pump(up_reader, writer, gate)),
            ]
            await asyncio.wait(conn.tasks, return_when=asyncio.FIRST_EXCEPTION)
        except (asyncio.CancelledError, OSError, TimeoutError):
            pass
        finally:
            self._conns.discard(conn)
            self._gates.pop(conn, None)
            conn.kill(rst=False)

    async def _gated_pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, gate: asyncio.Event) -> None:
        while True:
            data = await reader.read(self.chunk_size)
            if not data:
                return
            await gate.wait()
            writer.write(data)
            await writer.drain()


def test_black_holed_leader_fences_itself_and_a_second_harvester_takes_over(pg_url, table_name, topic_name, tmp_path):
    from pyharvest.bindings.kafka.embedded import free_port
    from tests.helpers.faults.kafka import broker_advertising

    create_outbox_table(pg_url, table_name)
    listen = free_port()
    with IsolatingProxy(upstream=("127.0.0.1", listen)) as proxy, broker_advertising(proxy.port, listen) as broker:
        bootstrap = broker.bootstrap_servers
        create_topic(bootstrap, topic_name, partitions=4)
        group = f"fence-{uuid.uuid4().hex[:8]}"
        events: list[tuple[float, object]] = []
        cfg = config(bootstrap, pg_url, table_name, group=group, limits={"shutdown_timeout": 2.0})
        # The group hands partition 0 to the member whose id sorts first (ids start with the
        # client.id): name the clients so the in-process harvester keeps leadership when the
        # standby joins, instead of hoping for it.
        cfg.base_kafka_config["client.id"] = "a-incumbent"
        old = Harvest(cfg)
        old.set_event_handler(lambda e: events.append((time.monotonic(), e)))
        writer = Writer(pg_url, table_name, topic_name, pause=0.02)
        standby = None
        try:
            old.start()
            wait_until(lambda: old.is_leader, 30, "the first harvester to lead")
            # The standby joins: the group may rebalance; wait until the old one leads again.
            cfg_path = tmp_path / "reaper.yaml"
            cfg_path.write_text(yaml.safe_dump({
                "harvest": {
                    "baseKafkaConfig": {"bootstrap.servers": bootstrap, "client.id": "z-standby"},
                    "leaderGroupID": group,
                    "dataSource": pg_url, "outboxTable": table_name,
                    "limits": {"heartbeatTimeout": "2s", "minPollInterval": "50ms"},
                },
                "logging": {"level": "Info"},
            }))
            # The standby's arrival rebalances the group and may move leadership to it; then
            # it is stopped (leadership returns) and another standby tried.
            for attempt in range(4):
                standby = Reaper(cfg_path, tmp_path / f"standby-{attempt}.log")
                wait_until(settled(cfg.base_kafka_config, group, 2), 60, "the group to settle with the standby")
                wait_until(lambda: old.is_leader or standby.is_leader(), 30, "a leader")
                if old.is_leader and not standby.is_leader():
                    break
                standby.signal(signal.SIGTERM)
                assert standby.wait(30) == 0
                wait_until(lambda: old.is_leader, 30, "leadership to return to the in-process harvester")
            else:
                pytest.fail("the in-process harvester never kept leadership beside a standby")
            writer.start()
            flowing(old, 100)
            proxy.isolate(os.getpid())  # the old leader's broker link goes silent
            cut = time.monotonic()
            wait_until(lambda: any(isinstance(e, LeaderFenced) for _t, e in events), 15, "LeaderFenced")
            fenced_at = next(t for t, e in events if isinstance(e, LeaderFenced))
            # The event comes at the fence (heartbeatTimeout after the cut), before the fenced
            # leader's in-flight records resolve; publication stops there too.
            assert fenced_at - cut < 2.0 + 5.0, "fenced late"
            assert not old.is_leader
            wait_until(standby.is_leader, 60, "the standby to take over")
            # Count what the old leader hands to its producer from the moment it fenced.
            published_at_fence = old.metrics.records_published
            # The writer goes on: records the fenced leader could publish, if it did, before the
            # new leader drains them all (the later event the absence is asserted after).
            written = len(writer.expected)
            wait_until(lambda: len(writer.expected) >= written + 400, 60, "more records written")
            writer.stop()
            wait_until(lambda: outbox_count(pg_url, table_name) == 0, 90, "the new leader to drain the outbox")
            assert old.metrics.records_published == published_at_fence, "the fenced leader published"
            assert not old.is_leader
            assert not any(isinstance(e, (LeaderAcquired, LeaderRefreshed)) and t > fenced_at for t, e in events)
            # The partition ends with the old leader's connections dead (not replayed).
            proxy.reset_isolated()
            proxy.isolate(None)
        finally:
            writer._stop.set()
            old.stop()
            old.join(30)
            if standby is not None and standby.proc.poll() is None:
                standby.signal(signal.SIGTERM)
                assert standby.wait(30) == 0
        check_topic(bootstrap, topic_name, writer.expected)


# ---------------------------------------------------------------------- database connection drops


def test_database_connection_dropped_during_marks_and_purges(pg_url, table_name, topic_name, kafka_bootstrap):
    create_outbox_table(pg_url, table_name)
    create_topic(kafka_bootstrap, topic_name, partitions=4)
    url = sa.make_url(pg_url)
    with FaultProxy(upstream=(url.host or "127.0.0.1", url.port or 5432)) as db_proxy:
        proxied_url = url.set(host="127.0.0.1", port=db_proxy.port).render_as_string(hide_password=False)
        events: list[object] = []
        writer = Writer(pg_url, table_name, topic_name)  # writes directly, not through the proxy
        h = Harvest(config(kafka_bootstrap, proxied_url, table_name, limits={"mark_backoff": 0.01}))
        h.set_event_handler(events.append)
        with h:
            wait_until(lambda: h.is_leader, 30, "leadership")
            writer.start()
            db_proxy.set_latency(0.02)  # marks and purges take a while: a reset lands inside one
            for _ in range(8):
                # Each reset once the harvester marks through the proxy again: it lands in a mark
                # or in the purges in between.
                marks = h.metrics.marks
                wait_until(lambda marks=marks: h.metrics.marks > marks, 60, "a mark through the proxy")
                db_proxy.reset_connections()
            writer.stop()
            db_proxy.heal()
            wait_until(lambda: outbox_count(pg_url, table_name) == 0, 90, "the outbox to drain")
        assert h.metrics.mark_errors > 0, h.metrics
        assert any(isinstance(e, LeaderRefreshed) for e in events)
        print(f"mark errors {h.metrics.mark_errors}, db errors {h.metrics.db_errors}, refreshes {h.metrics.leader_refreshes}")
    check_topic(kafka_bootstrap, topic_name, writer.expected)


def test_purges_retried_through_a_database_outage_leave_nothing_marked(pg_url, table_name, topic_name, kafka_bootstrap):
    create_outbox_table(pg_url, table_name)
    create_topic(kafka_bootstrap, topic_name, partitions=2)
    url = sa.make_url(pg_url)
    with FaultProxy(upstream=(url.host or "127.0.0.1", url.port or 5432)) as db_proxy:
        proxied_url = url.set(host="127.0.0.1", port=db_proxy.port).render_as_string(hide_password=False)
        writer = Writer(pg_url, table_name, topic_name, keys=20)
        h = Harvest(config(kafka_bootstrap, proxied_url, table_name, limits={"io_error_backoff": 0.2}))
        with h:
            wait_until(lambda: h.is_leader, 30, "leadership")
            writer.write(2000)
            wait_until(lambda: h.metrics.records_marked > 0, 20, "a mark")
            # The database goes away while records are being acknowledged: purges fail and retry.
            errors = h.metrics.db_errors
            db_proxy.refuse(True)
            db_proxy.reset_connections()
            wait_until(lambda: h.metrics.db_errors >= errors + 2, 30, "purges to fail and be retried")
            db_proxy.refuse(False)
            wait_until(lambda: outbox_count(pg_url, table_name) == 0, 90, "the outbox to drain")
        assert h.metrics.db_errors > 0, h.metrics
    writer.stop()
    check_topic(kafka_bootstrap, topic_name, writer.expected)


# ---------------------------------------------------------------------- SIGKILL with a full window


def test_leader_killed_with_a_full_in_flight_window_is_salvaged(pg_url, table_name, topic_name, tmp_path):
    create_outbox_table(pg_url, table_name)
    with proxied_broker() as (broker, proxy):
        bootstrap = broker.bootstrap_servers
        create_topic(bootstrap, topic_name, partitions=4)
        cfg_path = tmp_path / "reaper.yaml"
        cfg_path.write_text(yaml.safe_dump({
            "harvest": {
                "baseKafkaConfig": {"bootstrap.servers": bootstrap}, "leaderGroupID": f"kill-{uuid.uuid4().hex[:8]}",
                "dataSource": pg_url, "outboxTable": table_name,
                "limits": {"heartbeatTimeout": "2s", "minPollInterval": "50ms", "maxInFlightRecords": 2000},
            },
            "logging": {"level": "Info"},
        }))
        writer = Writer(pg_url, table_name, topic_name, keys=2000)
        writer.write(6000)
        reapers = [Reaper(cfg_path, tmp_path / f"reaper-{i}.log") for i in range(2)]
        try:
            proxy.set_latency(0.3)  # acks crawl: the window fills with unacknowledged records
            wait_until(lambda: any(r.is_leader() for r in reapers), 60, "a leader")
            victim = next(r for r in reapers if r.is_leader())
            heir = next(r for r in reapers if r is not victim)
            wait_until(lambda: marked_count(pg_url, table_name) >= 1500, 60, "the window to fill")
            remaining = outbox_count(pg_url, table_name)
            assert remaining > 1000, "the window should still be full"
            victim.signal(signal.SIGKILL)
            victim.wait(10)
            proxy.set_latency(0)
            wait_until(heir.is_leader, 60, "the standby to take over")
            wait_until(lambda: outbox_count(pg_url, table_name) == 0, 90, "the heir to salvage everything")
        finally:
            for r in reapers:
                if r.proc.poll() is None:
                    r.signal(signal.SIGTERM)
            for r in reapers:
                r.wait(30)
            writer.stop()
        check_topic(bootstrap, topic_name, writer.expected)
