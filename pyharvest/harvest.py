"""The harvester with its real bindings wired in: SQL through SQLAlchemy, Kafka through confluent-kafka."""

from __future__ import annotations

from collections.abc import Callable

from pyharvest.core.binding import DatabaseBinding, ShardableBinding
from pyharvest.core.config import Config
from pyharvest.core.harvest import HarvestEngine
from pyharvest.core.kafka import KafkaClients
from pyharvest.core.sharded import ShardedHarvestEngine

__all__ = ["Harvest", "ShardedHarvest"]


class Harvest(HarvestEngine):
    """Harvests an outbox table into Kafka.

    >>> config = Config(base_kafka_config={"bootstrap.servers": "localhost:9092"},
    ...                 data_source="postgresql+psycopg://app@localhost/app")
    >>> with Harvest(config) as harvest:   # doctest: +SKIP
    ...     harvest.join()

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
    ) -> None:
        resolved = config.resolve()
        if binding is None:

            def binding() -> DatabaseBinding:
                from pyharvest.bindings.sql import create_binding

                return create_binding(
                    resolved.data_source, resolved.outbox_table, resolved.binding,
                    quarantine=resolved.poison_policy == "quarantine",
                )

        if kafka is None:
            from pyharvest.bindings.kafka.confluent import ConfluentClients

            kafka = ConfluentClients()
        super().__init__(resolved, binding=binding, kafka=kafka)


class ShardedHarvest(ShardedHarvestEngine):
    """Harvests an outbox table in ``config.shards`` shards, with every other process of the
    leader group: each shard is led by one process at a time, so up to ``shards`` processes
    publish at once, and a crash stalls only the shards its process led.

    The table needs the key hash column and the shard index: ``reaper init-db --shards N``.
    ``binding`` and ``kafka`` replace the defaults, as for :class:`Harvest`.
    """

    def __init__(
        self,
        config: Config,
        *,
        binding: ShardableBinding | Callable[[], ShardableBinding] | None = None,
        kafka: KafkaClients | None = None,
    ) -> None:
        resolved = config.resolve()
        if binding is None:

            def binding() -> ShardableBinding:
                from pyharvest.bindings.sql import create_binding

                return create_binding(
                    resolved.data_source, resolved.outbox_table, resolved.binding,
                    quarantine=resolved.poison_policy == "quarantine",
                    engine_options={"pool_size": 2 * resolved.shards},
                )

        if kafka is None:
            from pyharvest.bindings.kafka.confluent import ConfluentClients

            kafka = ConfluentClients()
        super().__init__(resolved, binding=binding, kafka=kafka)
