"""The harvester with its real bindings wired in: SQL through SQLAlchemy, Kafka through confluent-kafka."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from pyharvest.core.binding import DatabaseBinding, ShardableBinding
from pyharvest.core.config import Config
from pyharvest.core.events import EventHandler
from pyharvest.core.harvest import HarvestEngine
from pyharvest.core.kafka import KafkaClients
from pyharvest.core.sharded import ShardedHarvestEngine

if TYPE_CHECKING:
    from pyharvest.bindings.sql import SqlBinding

__all__ = ["Harvest", "ShardedHarvest"]


def _sql_binding(config: Config) -> Callable[[], SqlBinding]:
    """The SQL binding ``config`` names, created when the harvester starts."""

    def create() -> SqlBinding:
        from pyharvest.bindings.sql import create_binding

        return create_binding(
            config.data_source, config.outbox_table, config.binding,
            quarantine=config.poison_policy == "quarantine",
            # The mark thread and the delivery thread of every shard hold a connection each.
            engine_options={"pool_size": 2 * config.shards} if config.shards > 1 else None,
        )

    return create


def _confluent() -> KafkaClients:
    from pyharvest.bindings.kafka.confluent import ConfluentClients

    return ConfluentClients()


class Harvest(HarvestEngine):
    """Harvests an outbox table into Kafka.

    >>> config = Config(base_kafka_config={"bootstrap.servers": "localhost:9092"},
    ...                 data_source="postgresql+psycopg://app@localhost/app")
    >>> with Harvest(config) as harvest:   # doctest: +SKIP
    ...     harvest.join()

    ``on_event`` receives every :mod:`~pyharvest.core.events` event (as does a handler given
    to :meth:`set_event_handler`, before or after :meth:`start`).
    ``binding`` and ``kafka`` replace the defaults (the SQL binding chosen by
    ``config.binding`` or the data source's scheme, and confluent-kafka clients). The engine
    underneath, which needs both given, is :class:`pyharvest.core.HarvestEngine`.
    """

    def __init__(
        self,
        config: Config,
        *,
        binding: DatabaseBinding | Callable[[], DatabaseBinding] | None = None,
        kafka: KafkaClients | None = None,
        on_event: EventHandler | None = None,
    ) -> None:
        resolved = config.resolve()
        super().__init__(
            resolved, binding=_sql_binding(resolved) if binding is None else binding,
            kafka=_confluent() if kafka is None else kafka,
        )
        if on_event is not None:
            self.set_event_handler(on_event)


class ShardedHarvest(ShardedHarvestEngine):
    """Harvests an outbox table in ``config.shards`` shards, with every other process of the
    leader group: each shard is led by one process at a time, so up to ``shards`` processes
    publish at once, and a crash stalls only the shards its process led.

    The table needs the key hash column and the shard index: ``reaper init-db --shards N``.
    ``on_event``, ``binding`` and ``kafka`` are as for :class:`Harvest`.
    """

    def __init__(
        self,
        config: Config,
        *,
        binding: ShardableBinding | Callable[[], ShardableBinding] | None = None,
        kafka: KafkaClients | None = None,
        on_event: EventHandler | None = None,
    ) -> None:
        resolved = config.resolve()
        super().__init__(
            resolved, binding=_sql_binding(resolved) if binding is None else binding,
            kafka=_confluent() if kafka is None else kafka,
        )
        if on_event is not None:
            self.set_event_handler(on_event)
