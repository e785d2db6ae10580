"""Who holds the database's clean-up back, on the real databases: a snapshot held open in
another session (PostgreSQL's REPEATABLE READ, MariaDB's consistent snapshot) is named, with
how long it has been held, by the binding the operations server reads; once it is released it
is named no more."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import sqlalchemy as sa

from pyharvest.bindings.sql import create_binding, create_outbox_table
from tests.helpers.waiting import wait_until

SNAPSHOTS = {
    "postgresql": ("BEGIN ISOLATION LEVEL REPEATABLE READ", "SELECT pg_backend_pid()", "pid {}"),
    "mysql": ("START TRANSACTION WITH CONSISTENT SNAPSHOT", "SELECT CONNECTION_ID()", "thread {}"),
}


def test_a_held_snapshot_is_named_with_its_age(dialect, database_url, table_name):  # type: ignore[no-untyped-def]
    if dialect not in SNAPSHOTS:
        pytest.skip(f"{dialect} does not say who holds its clean-up back")
    begin, whoami, named = SNAPSHOTS[dialect]
    create_outbox_table(database_url, table_name)
    binding = create_binding(database_url, table_name)
    engine = sa.create_engine(database_url, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as holder:
            session = named.format(holder.exec_driver_sql(whoami).scalar_one())
            holder.exec_driver_sql(begin)
            holder.exec_driver_sql(f"SELECT count(*) FROM {table_name}").all()  # the snapshot taken

            def held() -> bool:
                horizon = binding.cleanup_horizon()
                return horizon is not None and horizon.holder.startswith(session) and horizon.age_seconds is not None

            # InnoDB refreshes its information_schema tables only when they have not been read for
            # 0.1 s: asked every 10 ms they would never change. So these waits ask every 0.3 s.
            wait_until(held, 10, lambda: f"{session} named: {binding.cleanup_horizon()}", interval=0.3)
            first = binding.cleanup_horizon()
            assert first is not None and first.behind is not None
            wait_until(lambda: (binding.cleanup_horizon().age_seconds or 0) > (first.age_seconds or 0), 10,
                       "its age to grow", interval=0.3)
            holder.exec_driver_sql("ROLLBACK")
            wait_until(lambda: not binding.cleanup_horizon().holder.startswith(session), 10,
                       lambda: f"{session} no longer named: {binding.cleanup_horizon()}", interval=0.3)
    finally:
        engine.dispose()
        binding.dispose()


def test_the_gauges_say_who_holds_it(dialect, database_url, table_name):  # type: ignore[no-untyped-def]
    if dialect not in SNAPSHOTS:
        pytest.skip(f"{dialect} does not say who holds its clean-up back")
    pytest.importorskip("prometheus_client")
    from pyharvest.bindings.ops.collector import watch_gauges

    create_outbox_table(database_url, table_name)
    binding = create_binding(database_url, table_name)
    try:
        watch = SimpleNamespace(age=None, quarantined=None, horizon=binding.cleanup_horizon())
        families = {f.name: f for f in watch_gauges("pyharvest", watch)}  # type: ignore[arg-type]
    finally:
        binding.dispose()
    (sample,) = families["pyharvest_cleanup_horizon_age_seconds"].samples
    assert set(sample.labels) == {"holder"} and sample.value >= 0
    assert "pyharvest_cleanup_horizon_behind" in families
