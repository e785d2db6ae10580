"""A shared database's bad day, in CI: while another session holds the clean-up horizon back
(a snapshot left open, as a long analytics query or a ``BEGIN`` in a console does), a harvester
relays a writer's records on the live database and Apache Kafka. Nothing may be lost or
reordered, the backlog must stay bounded while the horizon is held (the marks keep up: the
key-set cursor keeps them from walking every row purged since the hold began), and the outbox
must empty once it is released. No timing is asserted: the hold lasts a number of records, so
a slow machine holds it longer, not less.

benchmarks/soak.py --hold measures the same for minutes, with its latency per window.
"""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from benchmarks.topic_check import read_back
from pyharvest import Harvest
from pyharvest.bindings.sql import create_outbox_table
from tests.helpers.fixtures.kafka import on_embedded_broker
from tests.helpers.outbox import Writer, outbox_count
from tests.helpers.reapers import config
from tests.helpers.topics import create_topic
from tests.helpers.waiting import wait_until

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(420)]

# How another session holds the horizon, and how it sees that it does (the test's premise).
SNAPSHOTS = {
    "postgresql": ("BEGIN ISOLATION LEVEL REPEATABLE READ", "SELECT count(*) FROM pg_class",
                   "SELECT backend_xmin IS NOT NULL FROM pg_stat_activity WHERE pid = pg_backend_pid()"),
    "mysql": ("START TRANSACTION WITH CONSISTENT SNAPSHOT", "SELECT count(*) FROM information_schema.SCHEMATA",
              "SELECT count(*) > 0 FROM information_schema.INNODB_TRX WHERE trx_mysql_thread_id = CONNECTION_ID()"),
}
HELD_FOR = 60_000  # records written while the horizon is held: about a minute of this writer
BOUND = 15_000  # the backlog while held, at most: a quarter of the hold (the relay keeps up)


def pages_a_mark_reads(url: str, table: str, binding) -> dict[str, int]:  # noqa: ANN001 - the SqlBinding
    """The pages the mark's row choice reads from the cursor's floor and from the lowest id
    (PostgreSQL's EXPLAIN (ANALYZE, BUFFERS), without the row locks)."""
    _, floor = binding.cursor.position()
    engine = sa.create_engine(url)
    out = {}
    try:
        with engine.connect() as c:
            for name, after in (("cursor", floor), ("lowest", 0)):
                plan = c.exec_driver_sql(
                    f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) SELECT id FROM {table} WHERE id > {int(after)} "
                    "AND (leader_id IS NULL OR leader_id <> 'probe') ORDER BY id LIMIT 1000").scalar()
                top = plan[0]["Plan"]
                out[name] = top.get("Shared Hit Blocks", 0) + top.get("Shared Read Blocks", 0)
            c.rollback()
    finally:
        engine.dispose()
    return out


def test_a_held_cleanup_horizon_loses_nothing_and_the_backlog_stays_bounded(
    dialect, database_url, table_name, topic_name, kafka_bootstrap
):  # type: ignore[no-untyped-def]
    if dialect not in SNAPSHOTS:
        pytest.skip(f"{dialect} has no other session to hold its clean-up back")
    if on_embedded_broker():
        pytest.skip("a minute of records at this rate is for Apache Kafka")
    begin, read, holding = SNAPSHOTS[dialect]
    create_outbox_table(database_url, table_name)
    create_topic(kafka_bootstrap, topic_name, partitions=4)
    writer = Writer(database_url, table_name, topic_name, keys=200, batch=100, pause=0.05)
    # The key-set cursor is opt-in: what it is for is this.
    h = Harvest(config(kafka_bootstrap, database_url, table_name, limits={"mark_lookback": 1.0}))
    holder_engine = sa.create_engine(database_url, isolation_level="AUTOCOMMIT")
    backlog = [0]

    def written_while_held(since: int) -> int:
        backlog[0] = max(backlog[0], outbox_count(database_url, table_name))
        return len(writer.expected) - since

    try:
        with h, holder_engine.connect() as holder:
            wait_until(lambda: h.is_leader, 60, "leadership")
            writer.start()
            wait_until(lambda: len(writer.expected) > 2_000 and outbox_count(database_url, table_name) < 1_000, 60,
                       "records to flow")
            holder.exec_driver_sql(begin)
            holder.exec_driver_sql(read).all()  # the snapshot taken: from here nothing purged is cleaned up
            assert holder.exec_driver_sql(holding).scalar(), "the session does not hold the clean-up horizon"
            since = len(writer.expected)
            wait_until(lambda: written_while_held(since) >= HELD_FOR, 300,
                       lambda: f"{HELD_FOR} records written while held (backlog at most {backlog[0]})", interval=0.5)
            assert holder.exec_driver_sql(holding).scalar(), "the session let the clean-up horizon go"
            if dialect == "postgresql":
                pages = pages_a_mark_reads(database_url, table_name, h.binding)
            holder.exec_driver_sql("ROLLBACK")
            writer.stop()
            wait_until(lambda: outbox_count(database_url, table_name) == 0, 120, "the outbox to empty after the release")
            assert h.health().running and h.is_leader
    finally:
        writer._stop.set()
        holder_engine.dispose()
    print(f"{dialect}: {len(writer.expected)} records, the backlog at most {backlog[0]} while held")
    assert backlog[0] <= BOUND, f"the backlog reached {backlog[0]} while the horizon was held"
    if dialect == "postgresql":
        # What the key-set cursor is for: the dead rows of the whole hold lie below where the
        # marks start, and a mark from there reads a fraction of a mark from the lowest id.
        print(f"pages a mark reads while held: {pages}")
        assert pages["cursor"] * 5 < pages["lowest"], pages
    report, _ = read_back(kafka_bootstrap, topic_name, writer.expected, timeout=120, nudge_missing=False)
    assert report.lost_count == 0 and report.reorder_count == 0, str(report)
