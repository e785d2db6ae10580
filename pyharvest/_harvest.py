"""The harvester with its real bindings wired in: SQL through SQLAlchemy, Kafka through confluent-kafka."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Self

from pyharvest.core.config.choices import PoisonPolicy
from pyharvest.core.config.settings import Config
from pyharvest.core.engine.harvest import HarvestEngine
from pyharvest.core.engine.lifecycle import State
from pyharvest.core.engine.sharded import ShardedHarvestEngine
from pyharvest.core.errors import ConfigError
from pyharvest.core.healing.stuck_clients import heal_after
from pyharvest.core.ports.database import DatabaseBinding, ShardableBinding
from pyharvest.core.ports.kafka import KafkaClients
from pyharvest.core.publishing.blocked_keys import BlockedKey
from pyharvest.core.telemetry.events import EventHandler
from pyharvest.core.telemetry.health import Health
from pyharvest.core.telemetry.metrics import HarvestMetrics

if TYPE_CHECKING:
    from pyharvest.bindings.sql import SqlBinding

__all__ = ["Harvest"]


def _sql_binding(config: Config, init_db: str | None = None) -> Callable[[], SqlBinding]:
    """The SQL binding ``config`` names, created when the harvester starts; a missing table's
    error advises ``init_db`` (``reaper -f FILE`` passes ``reaper init-db -f FILE``), or the
    data source's own ``reaper init-db`` command."""

    def create() -> SqlBinding:
        from pyharvest.bindings.sql import create_binding

        return create_binding(
            config.data_source, config.outbox_table, config.binding,
            quarantine=config.poison_policy == PoisonPolicy.QUARANTINE,
            # The mark thread and the delivery thread of every shard hold a connection each.
            engine_options={"pool_size": 2 * config.shards} if config.shards > 1 else None,
            lock_timeout=config.limits.lock_timeout or None,  # resolved; 0: the database's own
            init_db=init_db,
            mark_lookback=config.limits.mark_lookback or 0.0,  # resolved
            late_row_scan_interval=config.limits.late_row_scan_interval or 5.0,
        )

    return create


def _confluent(config: Config) -> KafkaClients:
    from pyharvest.bindings.kafka.transactions import ConfluentTransactionalClients

    # A client stuck for three of the leader group's sessions, while the cluster answers a
    # fresh one, is replaced (pyharvest.core.healing.stuck_clients).
    assert config.limits.heartbeat_timeout is not None  # resolved
    return ConfluentTransactionalClients(heal_after=heal_after(config.limits.heartbeat_timeout))


class Harvest:
    """Harvests an outbox table into Kafka, in ``config.shards`` shards.

    >>> config = Config(base_kafka_config={"bootstrap.servers": "localhost:9092"},
    ...                 data_source="postgresql+psycopg://app@localhost/app")
    >>> with Harvest(config) as harvest:   # doctest: +SKIP
    ...     harvest.run()     # until Ctrl-C or SIGTERM, then a graceful stop

    With ``shards: 1`` (the default) one process of the leader group leads the whole outbox;
    with ``shards: N`` each shard is led by one process at a time, so up to N processes
    publish at once and a crash stalls only the shards its process led (the table needs the
    key hash column and the shard index: ``reaper init-db --shards N``). Every process of a
    leader group needs the same ``shards``; the leader topic's partition count is checked
    against it at start.

    ``on_event`` receives every :mod:`~pyharvest.events` event (as does a handler given
    to :meth:`set_event_handler`, before or after :meth:`start`); with shards, each carries its
    ``shard``. ``binding`` and ``kafka`` replace the defaults (the SQL binding chosen by
    ``config.binding`` or the data source's scheme, and confluent-kafka clients).

    What runs underneath is :attr:`runner`: the engine of the whole outbox, or (with shards)
    the one that runs an engine for each shard this process leads.
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
        from pyharvest.bindings.ops.tracing import install as install_tracing

        install_tracing()  # per-batch spans, recorded once OpenTelemetry has a tracer provider
        source = _sql_binding(resolved) if binding is None else binding
        clients = _confluent(resolved) if kafka is None else kafka
        self.runner: HarvestEngine | ShardedHarvestEngine
        if resolved.shards == 1:
            self.runner = HarvestEngine(resolved, binding=source, kafka=clients)
        else:
            if isinstance(source, DatabaseBinding) and not isinstance(source, ShardableBinding):
                raise ConfigError(
                    "shards", f"shards is {resolved.shards}, but the binding {source!r} cannot mark a shard's "
                    "rows (it has no for_shard)"
                )
            # A factory's binding is checked when it is created, at start.
            self.runner = ShardedHarvestEngine(resolved, binding=source, kafka=clients)  # type: ignore[arg-type]
        if on_event is not None:
            self.set_event_handler(on_event)

    @property
    def config(self) -> Config:
        return self.runner.config

    @property
    def state(self) -> State:
        return self.runner.state

    def start(self) -> None:
        """Connect and start harvesting in the background. Errors at start-up (unreachable
        database, missing or unsharded table, unreachable broker, a leader topic whose
        partition count is not ``shards``) are raised here."""
        self.runner.start()

    def stop(self) -> None:
        """Ask the harvester to stop; returns at once. In-flight records are given
        ``limits.shutdownTimeout`` to be acknowledged and purged; any left are picked up by
        the next leader. Use :meth:`join` to wait."""
        self.runner.stop()

    def join(self, timeout: float | None = None) -> bool:
        """Wait until stopped; re-raise whatever crashed it. Returns False on timeout."""
        return self.runner.join(timeout)

    def run(self) -> None:
        """Harvest until SIGINT (Ctrl-C) or SIGTERM, then stop gracefully, as ``reaper`` does:
        in-flight records are settled and the leader group is left, so that another process
        takes over at once; no ``KeyboardInterrupt``. Starts the harvester unless it runs;
        re-raises whatever stopped it otherwise. Call it from the main thread."""
        from pyharvest._signals import run_until_signalled

        run_until_signalled(self)

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
        self.join()

    def set_event_handler(self, handler: EventHandler) -> None:
        """Register the callback for :mod:`pyharvest.events`, before or after :meth:`start`."""
        self.runner.set_event_handler(handler)

    def health(self) -> Health:
        """What a readiness probe needs: running, leading, and whether the broker and the
        database answer (``None`` where the binding or client cannot tell)."""
        return self.runner.health()

    @property
    def is_leader(self) -> bool:
        """Whether this process leads the outbox, or at least one of its shards."""
        return self.runner.is_leader

    @property
    def blocked_keys(self) -> tuple[BlockedKey, ...]:
        """The keys held back by a record Kafka refuses for good (``poisonPolicy: block``, or
        ``quarantine`` before ``maxDeliveryAttempts``), longest blocked first: each key's
        later records wait until its record goes through, is quarantined, or its row is
        deleted. At most 100 (of every shard this process leads); :attr:`blocked_key_count`
        counts them all. The status page, ``/readyz`` and ``pyharvest_blocked_keys`` show them."""
        return self.runner.blocked_keys

    @property
    def blocked_key_count(self) -> int:
        """How many keys are held back, including those :attr:`blocked_keys` leaves out."""
        return self.runner.blocked_key_count

    @property
    def engines(self) -> dict[int, HarvestEngine]:
        """The engine of every shard this process has led so far, by shard (shard 0 alone,
        from construction, when the outbox is not sharded)."""
        runner = self.runner
        return {0: runner} if isinstance(runner, HarvestEngine) else runner.engines

    @property
    def leading_shards(self) -> list[int]:
        runner = self.runner
        if isinstance(runner, HarvestEngine):
            return [0] if runner.is_leader else []
        return runner.leading_shards

    # What only a whole-outbox harvester has; a sharded one has them per engine (engines).

    @property
    def _engine(self) -> HarvestEngine:
        runner = self.runner
        if not isinstance(runner, HarvestEngine):
            raise AttributeError(
                f"a harvester of {self.config.shards} shards has one engine per shard: see its engines"
            )
        return runner

    @property
    def metrics(self) -> HarvestMetrics:
        return self._engine.metrics

    @property
    def leader_id(self) -> str | None:
        return self._engine.leader_id

    @property
    def in_flight_records(self) -> int:
        return self._engine.in_flight_records

    @property
    def in_flight_record_keys(self) -> list[str]:
        return self._engine.in_flight_record_keys

    @property
    def parked_records(self) -> int:
        """Marked records parked in memory behind an in-flight record of the same key."""
        return self._engine.parked_records

    @property
    def backlog_in_memory(self) -> int:
        """Deprecated name of :attr:`parked_records`."""
        warnings.warn("Harvest.backlog_in_memory is deprecated: use Harvest.parked_records", DeprecationWarning,
                      stacklevel=2)
        return self._engine.parked_records

    @property
    def binding(self) -> DatabaseBinding | None:
        return self._engine.binding
