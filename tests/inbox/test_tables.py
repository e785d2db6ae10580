"""Consumers of one group often start together: creating the inbox's tables must not race."""

from __future__ import annotations

import threading

import sqlalchemy as sa

from pyharvest.bindings.sql.inbox.tables import InboxTables


def test_concurrent_creation_of_the_tables_succeeds(database_url, table_name):
    errors: list[BaseException] = []
    barrier = threading.Barrier(4)

    def create() -> None:
        engine = sa.create_engine(database_url)
        try:
            tables = InboxTables.build(f"{table_name}_cp", f"{table_name}_dd", f"{table_name}_dl")
            barrier.wait()
            tables.create(engine)
        except BaseException as e:  # noqa: BLE001
            errors.append(e)
        finally:
            engine.dispose()

    threads = [threading.Thread(target=create) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    names = {n.lower() for n in sa.inspect(sa.create_engine(database_url)).get_table_names()}
    assert {f"{table_name}_cp", f"{table_name}_dd", f"{table_name}_dl"} <= names
