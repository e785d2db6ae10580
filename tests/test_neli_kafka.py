"""Fast NELI against a real broker (Apache Kafka by default): one leader among many,
takeover when the leader leaves, fencing when heartbeats stop coming back."""

from __future__ import annotations

import time
import uuid

import pytest

from pyharvest import Config, Limits
from pyharvest.bindings.kafka.confluent import ConfluentClients
from pyharvest.core.engine.harvest import HarvestEngine
from pyharvest.core.ports.kafka import TopicError
from pyharvest.core.telemetry.events import LeaderAcquired, LeaderRevoked
from tests.helpers.fakes import FakeBinding
from tests.helpers.groups import settled
from tests.helpers.waiting import wait_until

pytestmark = pytest.mark.kafka


def harvester(kafka_config, group: str, db: FakeBinding, events: list, group_protocol: str = "classic") -> HarvestEngine:
    cfg = Config(
        base_kafka_config=dict(kafka_config),
        leader_group_id=group,
        data_source="fake://",
        group_protocol=group_protocol,
        limits=Limits(heartbeat_timeout=2.0, min_poll_interval=0.05, mark_backoff=0.01, shutdown_timeout=5.0),
    )
    h = HarvestEngine(cfg, binding=db, kafka=ConfluentClients())
    h.set_event_handler(events.append)
    return h


def test_exactly_one_leader_and_takeover_on_graceful_stop(kafka_config, group_protocol):
    group = f"neli-{uuid.uuid4().hex[:8]}"
    db = FakeBinding()
    e1: list = []
    e2: list = []
    h1 = harvester(kafka_config, group, db, e1, group_protocol)
    h2 = harvester(kafka_config, group, db, e2, group_protocol)
    h1.start()
    try:
        wait_until(lambda: h1.is_leader)
        h2.start()
        wait_until(settled(kafka_config, group, 2), 60, "the leader group to settle with two members")
        # The leader hears of the assignment at its next poll: then there is exactly one.
        wait_until(lambda: h1.is_leader or h2.is_leader, 30, "a leader")
        assert [h1.is_leader, h2.is_leader].count(True) == 1
        leader, standby = (h1, h2) if h1.is_leader else (h2, h1)
        leader.stop()
        assert leader.join(20)
        wait_until(lambda: standby.is_leader)
        acquired = [e for e in e1 + e2 if isinstance(e, LeaderAcquired)]
        assert len({e.leader_id for e in acquired}) == len(acquired), "leader ids are never reused"
        assert any(isinstance(e, LeaderRevoked) for e in (e1 if leader is h1 else e2))
    finally:
        for h in (h1, h2):
            h.stop()
        for h in (h1, h2):
            h.join(30)


def test_unreachable_broker_fails_at_start_with_a_clear_error():
    from pyharvest.bindings.kafka.embedded import free_port
    from tests.helpers.fixtures.databases import unique_table  # noqa: F401 - keeps import graph simple

    cfg = Config(base_kafka_config={"bootstrap.servers": f"127.0.0.1:{free_port()}", "socket.timeout.ms": 1000},
                 leader_group_id="unreachable", data_source="fake://")
    h = HarvestEngine(cfg, binding=FakeBinding(), kafka=ConfluentClients())
    start = time.monotonic()
    with pytest.raises(TopicError, match="cannot reach Kafka"):
        h.start()
    assert time.monotonic() - start < 30
