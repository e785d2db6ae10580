"""Making a table ready for shards while writers run: no key ends up in two shards.

A writer that read the table before ``reaper init-db --shards N`` added the key hash column
would go on writing rows without a hash, which the shard filter puts in shard 0 while the
same key's other rows sit in their own shard: two leaders publishing one key. ``init-db``
makes the table refuse such rows (the dialect's key hash guard); the writer's stasher
reports the refusal once, rereads the table, and the transaction run again stores the hash.
A sharded harvester refuses a table that is not ready, naming the command that readies it.
"""

from __future__ import annotations

import subprocess
import uuid
from pathlib import Path

import pytest
import sqlalchemy as sa

from benchmarks.children import python_module
from pyharvest import Config, Harvest, Limits
from pyharvest.bindings.sql import create_binding, create_outbox_table
from pyharvest.bindings.sql.shard_schema import key_hash_guard_name
from pyharvest.core.errors import BindingError
from pyharvest.core.outbox.keys import key_hash
from pyharvest.core.outbox.records import OutboxRecord
from pyharvest.errors import OutboxTableChangedError
from pyharvest.plugins.api import parse_table_name
from pyharvest.stasher import Stasher
from tests.helpers.waiting import wait_until

ROOT = Path(__file__).resolve().parent.parent


def made_before_the_key_hash(url: str, table: str) -> sa.Engine:
    """A table as versions before the key hash column made it."""
    create_outbox_table(url, table)
    engine = sa.create_engine(url)
    with engine.begin() as tx:
        tx.execute(sa.text(f"ALTER TABLE {table} DROP COLUMN kafka_key_hash"))
    return engine


def hashes(engine: sa.Engine, table: str) -> list[tuple[str, int | None]]:
    t = sa.table(table, sa.column("id"), sa.column("kafka_key"), sa.column("kafka_key_hash"))
    with engine.connect() as c:
        return [tuple(r) for r in c.execute(sa.select(t.c.kafka_key, t.c.kafka_key_hash).order_by(t.c.id))]


def test_a_stasher_that_read_the_table_before_init_db_shards_is_refused_once(database_url: str, table_name: str):
    engine = made_before_the_key_hash(database_url, table_name)
    try:
        stasher = Stasher(table_name)
        with engine.begin() as tx:
            stasher.stash(tx, OutboxRecord("t", "early", b"1"))  # the stasher learns the old shape
        create_outbox_table(database_url, table_name, shards=4)
        with pytest.raises(OutboxTableChangedError, match="roll this transaction back and run it again"):
            with engine.begin() as tx:
                stasher.stash(tx, OutboxRecord("t", "late", b"2"))
        with engine.begin() as tx:  # run again: the stasher has reread the table
            stasher.stash_many(tx, [OutboxRecord("t", "late", b"2"), OutboxRecord("t", "later", b"3")])
        assert hashes(engine, table_name) == [(k, key_hash(k)) for k in ("early", "late", "later")]
    finally:
        engine.dispose()


def test_shards_refuse_a_table_not_ready_for_them_and_name_the_fix(
    database_url: str, dialect: str, table_name: str
) -> None:
    create_outbox_table(database_url, table_name)  # the key hash column, but no shard index nor guard
    binding = create_binding(database_url, table_name)
    try:
        with pytest.raises(BindingError, match=rf"no index for 4 shards.*init-db .*--table {table_name} --shards 4"):
            binding.for_shard(4, 0)
        create_outbox_table(database_url, table_name, shards=4)
        binding.for_shard(4, 0).dispose()
        # A table readied by an earlier version: the index, but rows without a hash still accepted.
        guard = key_hash_guard_name(parse_table_name(table_name))
        drop = f"ALTER TABLE {table_name} DROP CONSTRAINT {guard}" if dialect == "postgresql" else f"DROP TRIGGER {guard}"
        with binding.engine.begin() as tx:
            tx.execute(sa.text(drop))
        binding.dispose()
        binding = create_binding(database_url, table_name)  # a harvester starting now
        with pytest.raises(BindingError, match=r"accepts rows without a key hash.*--shards 4"):
            binding.for_shard(4, 0)
        create_outbox_table(database_url, table_name, shards=4)  # puts the guard back
        binding.for_shard(4, 0).dispose()
    finally:
        binding.dispose()


@pytest.mark.kafka
def test_a_writer_running_through_init_db_shards_keeps_every_key_in_one_shard(
    dialect: str, kafka_config, kafka_bootstrap, database_url: str, table_name: str, topic_name: str, tmp_path: Path
) -> None:
    """The issue's run: a table made without the column, a writer process started before
    ``init-db --shards 2`` and still writing after it, two sharded harvesters; every record
    arrives, in order per key."""
    if dialect != "postgresql":
        pytest.skip("one database suffices for the processes and the broker; the guard is checked on each above")
    from benchmarks.topic_check import read_back
    from tests.helpers.outbox import wait_empty
    from tests.helpers.topics import create_topic

    engine = made_before_the_key_hash(database_url, table_name)
    create_topic(kafka_bootstrap, topic_name, partitions=4)
    out, stop = tmp_path / "committed", tmp_path / "stop"
    out.touch()

    def committed() -> list[tuple[str, bytes]]:
        lines = out.read_text().splitlines()
        return [(k, v.encode()) for k, v in (line.split(" ") for line in lines)]

    writer = subprocess.Popen(
        [*python_module("tests.helpers.stash_writer"), database_url, table_name, topic_name, str(out), str(stop)],
        cwd=ROOT, stdout=subprocess.PIPE, text=True,
    )
    group = f"migrate-{uuid.uuid4().hex[:8]}"
    config = Config(
        base_kafka_config=dict(kafka_config), leader_group_id=group, data_source=database_url,
        outbox_table=table_name, shards=2, limits=Limits(heartbeat_timeout=2.0, min_poll_interval=0.05),
    )
    harvests: list[Harvest] = []
    try:
        wait_until(lambda: len(committed()) >= 300, 60, "the writer to write with the old shape")
        create_outbox_table(database_url, table_name, shards=2)  # reaper init-db --shards 2
        before = len(committed())
        wait_until(lambda: len(committed()) >= before + 300, 60, "the writer to write after init-db")
        assert all(h is not None for _k, h in hashes(engine, table_name))  # no row in a shard not its key's
        harvests = [Harvest(config), Harvest(config)]
        for h in harvests:
            h.start()
        wait_until(lambda: all(h.leading_shards for h in harvests), 60, "both harvesters to lead a shard")
        more = len(committed())
        wait_until(lambda: len(committed()) >= more + 300, 60, "the writer to write while both harvest")
    finally:
        stop.touch()
        summary, _ = writer.communicate(timeout=60)
        try:
            wait_empty(database_url, table_name)
        finally:
            for h in harvests:
                h.stop()
            for h in harvests:
                assert h.join(60)
            engine.dispose()
    report, _hidden = read_back(kafka_bootstrap, topic_name, committed(), timeout=90)
    assert report.lost_count == 0 and report.reorder_count == 0, report
    assert writer.returncode == 0 and int(summary.split()[-1]) >= 1, summary  # refused once, then wrote on
