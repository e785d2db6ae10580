"""A ``shards:`` run's log: each line an engine logs names the shard it concerns, on the
engine's own threads and on the group's (a revocation), on a real database and broker."""

from __future__ import annotations

import logging
import uuid

import pytest

from pyharvest import Config, Harvest, Limits
from pyharvest.bindings.sql import create_outbox_table
from tests.helpers.waiting import wait_until

pytestmark = pytest.mark.kafka

SHARDS = 2


def test_every_engine_line_names_its_shard(kafka_config, database_url, table_name, caplog) -> None:  # type: ignore[no-untyped-def]
    caplog.set_level(logging.INFO, logger="pyharvest")
    create_outbox_table(database_url, table_name, shards=SHARDS)
    harvest = Harvest(Config(
        base_kafka_config=dict(kafka_config), leader_group_id=f"shard-logs-{uuid.uuid4().hex[:8]}",
        data_source=database_url, outbox_table=table_name, shards=SHARDS,
        limits=Limits(heartbeat_timeout=2.0, min_poll_interval=0.05),
    ))
    with harvest:
        wait_until(lambda: harvest.leading_shards == list(range(SHARDS)), 60, "every shard led", interval=0.05)
    engine_lines = [r.getMessage() for r in caplog.records if r.name == "pyharvest.harvest"]
    for shard in range(SHARDS):
        mine = [line for line in engine_lines if line.startswith(f"[shard {shard}] ")]
        assert any("elected leader" in line for line in mine), engine_lines
        assert any(f"starting harvester {harvest.config.name}:" in line for line in mine)
        assert any("stopped" in line for line in mine), mine
    # The process's own lines (the group, the sharded harvester) carry no shard.
    assert any(line.startswith("starting sharded harvester") for line in engine_lines)
