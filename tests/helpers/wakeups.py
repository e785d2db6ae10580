"""What the tests of an idle harvester's wake-ups share (PostgreSQL's NOTIFY in
tests/test_push_wakeups.py, wake-up datagrams in tests/test_wake_datagrams.py): an outbox of
its own on a live server, a harvester whose empty marks back off, waiting until they have, and
a lone record stashed."""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Iterator

import sqlalchemy as sa

from pyharvest import Config, Harvest, Limits, OutboxRecord, stasher
from pyharvest.bindings.sql import create_outbox_table
from tests.helpers.fixtures.databases import unique_table
from tests.helpers.waiting import wait_until


@contextlib.contextmanager
def outbox_on(url: str) -> Iterator[str]:
    """A new outbox table at ``url``, dropped afterwards."""
    name = unique_table()
    create_outbox_table(url, name)
    try:
        yield name
    finally:
        engine = sa.create_engine(url)
        with engine.begin() as c:
            c.execute(sa.text(f"DROP TABLE IF EXISTS {name}"))
        engine.dispose()


def harvester(kafka_config: dict[str, object], url: str, table: str, max_mark_backoff: float,
              group: str = "wake") -> Harvest:
    """A harvester whose empty marks back off to ``max_mark_backoff``."""
    return Harvest(Config(
        base_kafka_config=dict(kafka_config),
        leader_group_id=f"{group}-{uuid.uuid4().hex[:8]}",
        data_source=url,
        outbox_table=table,
        limits=Limits(heartbeat_timeout=2.0, min_poll_interval=0.05, mark_backoff=0.01,
                      max_mark_backoff=max_mark_backoff),
    ))


def idle(h: Harvest) -> bool:
    """Whether every shard ``h`` leads pauses between its empty marks a second or more (or as
    long as ``maxMarkBackoff`` lets it, if shorter)."""
    engines = [h.engines[s] for s in h.leading_shards]
    return bool(engines) and all(e._idle.pause >= min(1.0, e._idle.bound) for e in engines)


def lead_and_idle(h: Harvest) -> None:
    """Wait until ``h`` leads and its pause between empty marks has grown past a second."""
    wait_until(lambda: h.is_leader)
    wait_until(lambda: idle(h), 30, "the pause between empty marks to grow")


def stash_one(engine: sa.Engine, table: str, topic: str, value: bytes) -> float:
    """Stash one record under key ``k`` and commit; when the commit returned (monotonic)."""
    with engine.begin() as tx:
        stasher.Stasher(table).stash(tx, OutboxRecord(topic, "k", value))
    return time.monotonic()
