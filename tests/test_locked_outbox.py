"""A shared database's locks, on real databases and a real broker: another session holds a
lock on the outbox (a ``LOCK TABLE``; a console's ``SELECT ... FOR UPDATE`` left open on
PostgreSQL; on MariaDB a transaction that inserted a row and stays open), and
the harvester does not hang silently: its statements wait at most ``limits.lockTimeout``,
the log and ``/readyz`` (503) name the session that holds the lock, ``/healthz`` stays 200,
and once the lock is released it harvests again with nothing lost and every key in order.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import sqlalchemy as sa

pytest.importorskip("prometheus_client")

from pyharvest import Config, Harvest, Limits  # noqa: E402
from pyharvest.bindings.ops import OpsServer, start_ops_server  # noqa: E402
from pyharvest.bindings.sql import create_outbox_table  # noqa: E402
from tests.helpers.ops import get, probe  # noqa: E402
from tests.helpers.outbox import Writer, outbox_count  # noqa: E402
from tests.helpers.reapers import check_topic  # noqa: E402
from tests.helpers.topics import create_topic  # noqa: E402
from tests.helpers.waiting import wait_until  # noqa: E402

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(180)]

#: How each database is locked, and how it names the session that holds the lock.
LOCKS = {
    ("postgresql", "table"): ("LOCK TABLE {t} IN ACCESS EXCLUSIVE MODE", "SELECT pg_backend_pid()", "pid {}"),
    ("postgresql", "rows"): ("SELECT id FROM {t} FOR UPDATE", "SELECT pg_backend_pid()", "pid {}"),
    ("mysql", "table"): ("LOCK TABLES {t} WRITE", "SELECT CONNECTION_ID()", "thread {}"),
    # InnoDB: a locking read waits on a row another transaction inserted and has not committed
    # (a FOR UPDATE there would lock only the gap past the last row, blocking the writer, not
    # the harvester, whenever the outbox is empty at that moment).
    ("mysql", "rows"): (
        "INSERT INTO {t} (kafka_topic, kafka_key, kafka_value, kafka_headers) VALUES ('held', 'held', 'x', '')",
        "SELECT CONNECTION_ID()", "thread {}",
    ),
}


@contextmanager
def held(database_url: str, dialect: str, how: str, table: str) -> Iterator[str]:
    """Another session holding the lock, until the block ends; yields how the database names it."""
    lock, whoami, named = LOCKS[(dialect, how)]
    engine = sa.create_engine(database_url)
    conn = engine.connect()
    try:
        session = named.format(conn.exec_driver_sql(whoami).scalar_one())
        conn.commit()
        conn.exec_driver_sql(lock.format(t=table))  # in a transaction of its own, held open
        yield session
    finally:
        if dialect == "mysql" and how == "table":
            conn.exec_driver_sql("UNLOCK TABLES")
        conn.rollback()
        conn.close()
        engine.dispose()


@pytest.mark.parametrize("how", ["table", "rows"])
def test_a_locked_outbox_names_its_holder_and_is_harvested_once_released(  # type: ignore[no-untyped-def]
    how, dialect, database_url, table_name, topic_name, kafka_config, caplog
) -> None:
    if dialect not in ("postgresql", "mysql"):
        pytest.skip(f"{dialect} has no lock another session could hold on the table alone")
    caplog.set_level(logging.INFO, logger="pyharvest")
    create_outbox_table(database_url, table_name)
    bootstrap = str(kafka_config["bootstrap.servers"])
    create_topic(bootstrap, topic_name, partitions=2)
    cfg = Config(base_kafka_config=dict(kafka_config), leader_group_id=f"locked-{table_name}",
                 data_source=database_url, outbox_table=table_name,
                 limits=Limits(heartbeat_timeout=2.0, min_poll_interval=0.05, io_error_backoff=0.05))
    writer = Writer(database_url, table_name, topic_name, keys=20, batch=10, pause=0.02)
    harvest = Harvest(cfg)
    ops: OpsServer | None = start_ops_server(harvest, {"address": "127.0.0.1", "port": 0})
    assert ops is not None
    try:
        with harvest:
            wait_until(lambda: harvest.is_leader and probe(ops, '/readyz')[0] == 200, 30, "a ready leader")
            writer.start()
            wait_until(lambda: len(writer.expected) > 200, 30, "the writer's records")
            with held(database_url, dialect, how, table_name) as holder:
                def named() -> bool:
                    status, body = probe(ops, '/readyz')
                    why = body.get("errors", {}).get("database", "")
                    return status == 503 and "is locked" in why and holder in why

                wait_until(named, 60, lambda: f"/readyz to name {holder}: {probe(ops, '/readyz')}")
                assert get(ops.url + "/healthz")[0] == 200  # alive: a restart would not release the lock
                failed = [r.getMessage() for r in caplog.records if "is locked" in r.getMessage()]
                assert failed and holder in failed[0] and "limits.lockTimeout" in failed[0], failed
            wait_until(lambda: probe(ops, '/readyz')[0] == 200, 30, lambda: f"/readyz to recover: {probe(ops, '/readyz')}")
            writer.stop()
            wait_until(lambda: outbox_count(database_url, table_name) == 0, 60, "the outbox to drain")
    finally:
        writer._stop.set()
        ops.stop()
    check_topic(bootstrap, topic_name, writer.expected)

