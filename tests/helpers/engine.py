"""An engine on the fakes of its ports (:mod:`.fakes`): a quick one to harvest with (at least
once, or exactly once), an outbox to fill, and what reached Kafka per key."""

from __future__ import annotations

from collections import defaultdict

from pyharvest import Config, Limits
from pyharvest.core.engine.harvest import HarvestEngine
from tests.helpers.fakes import FakeBinding, FakeKafka


def make(binding: FakeBinding, kafka: FakeKafka, **limits: object) -> HarvestEngine:
    lim = Limits(min_poll_interval=0.005, heartbeat_timeout=0.5, mark_backoff=0.001, io_error_backoff=0.01,
                 min_metrics_interval=0.05, shutdown_timeout=2.0)
    for k, v in limits.items():
        setattr(lim, k, v)
    cfg = Config(leader_topic="app.neli", leader_group_id="app", data_source="fake://", limits=lim)
    return HarvestEngine(cfg, binding=binding, kafka=kafka)


def make_exactly_once(binding: FakeBinding, kafka: FakeKafka, **settings: object) -> HarvestEngine:
    """A quick engine with ``delivery: exactly-once`` (``kafka``: a ``FakeTransactionalKafka``);
    ``settings`` are the config's."""
    limits = Limits(
        min_poll_interval=0.005,
        heartbeat_timeout=0.5,
        mark_backoff=0.001,
        io_error_backoff=0.01,
        min_metrics_interval=0.05,
        shutdown_timeout=2.0,
        max_delivery_attempts=2,
    )
    cfg = Config(
        leader_topic="app.neli",
        leader_group_id="app",
        data_source="fake://",
        limits=limits,
        delivery="exactly-once",
        **settings,
    )  # type: ignore[arg-type]
    return HarvestEngine(cfg, binding=binding, kafka=kafka)


def per_key(log):
    out = defaultdict(list)
    for key, value in log:
        out[key].append(value)
    return out


def fill(binding: FakeBinding, n: int, keys: int, topic: str = "data") -> dict[str, list[bytes]]:
    expected: dict[str, list[bytes]] = defaultdict(list)
    for i in range(n):
        key = f"k{i % keys}"
        value = f"{i}".encode()
        binding.insert(topic, key, value)
        expected[key].append(value)
    return expected

