"""Harvesting an outbox in shards: one MP/R engine per shard this process leads.

:class:`ShardedHarvestEngine` joins the leader group once (:class:`~pyharvest.core.election.neli.ShardGroup`)
and, the first time a shard's partition is assigned to it, starts a
:class:`~pyharvest.core.engine.harvest.HarvestEngine` for that shard: its own leader id, in-flight
window, delivery thread and binding (marking only the shard's rows). The shards share one data
producer (:mod:`~pyharvest.core.publishing.shared_producer`), so their records batch together. Engines stay
up when their shard moves away (they only stop leading), so a shard that comes back resumes
at once. A crash of one process stalls only the shards it led, until the group gives them to
the others; every other shard keeps publishing.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from pyharvest.core.config.settings import Config, mask_data_source, mask_kafka_config
from pyharvest.core.election.leader_watch import LeaderSeen
from pyharvest.core.election.neli import ShardGroup, group_settings
from pyharvest.core.engine.harvest import HarvestEngine
from pyharvest.core.engine.lifecycle import Lifecycle, State
from pyharvest.core.errors import BindingError, HarvestError, MissingGrantError
from pyharvest.core.ports.database import ShardableBinding
from pyharvest.core.ports.kafka import KafkaClients
from pyharvest.core.publishing.blocked_keys import MAX_BLOCKED_SHOWN, BlockedKey
from pyharvest.core.publishing.modes import delivery_mode
from pyharvest.core.publishing.sender import producer_config
from pyharvest.core.publishing.shared_producer import SharedProducer
from pyharvest.core.telemetry.health import Health
from pyharvest.core.telemetry.logs import log, one_line

__all__ = ["ShardedHarvestEngine"]


class ShardedHarvestEngine(Lifecycle):
    """Harvests ``config.shards`` shards of one outbox with the other processes of the group.

    The same life cycle as :class:`~pyharvest.core.engine.harvest.HarvestEngine`: ``start``, ``stop``,
    ``join``, a context manager, events (each carrying its ``shard``) and ``health()``.
    """

    def __init__(
        self,
        config: Config,
        *,
        binding: ShardableBinding | Callable[[], ShardableBinding],
        kafka: KafkaClients,
    ) -> None:
        super().__init__()
        self.config = config.resolve()
        self._binding_source = binding
        self._binding: ShardableBinding | None = None
        self._kafka = kafka
        self._engines: dict[int, HarvestEngine] = {}
        self._lock = threading.Lock()
        self._group: ShardGroup | None = None
        self._producer: SharedProducer | None = None
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ public API

    @property
    def engines(self) -> dict[int, HarvestEngine]:
        """The engine of every shard this process has led so far, by shard."""
        with self._lock:
            return dict(self._engines)

    @property
    def leading_shards(self) -> list[int]:
        return sorted(p for p, e in self.engines.items() if e.is_leader)

    @property
    def is_leader(self) -> bool:
        return bool(self.leading_shards)

    def leaders(self) -> dict[int, LeaderSeen | None]:
        """Who leads each shard this process does not (None: not known yet), as the leader
        topic's last heartbeats say."""
        group = self._group
        return group.leaders() if group is not None else {}

    @property
    def blocked_keys(self) -> tuple[BlockedKey, ...]:
        """Every shard's keys held back by a record Kafka refuses for good, longest blocked
        first (at most :data:`~pyharvest.core.publishing.blocked_keys.MAX_BLOCKED_SHOWN`)."""
        keys = [b for e in self.engines.values() for b in e.blocked_keys]
        keys.sort(key=lambda b: (b.since, b.shard or 0, b.key))
        return tuple(keys[:MAX_BLOCKED_SHOWN])

    @property
    def blocked_key_count(self) -> int:
        return sum(e.blocked_key_count for e in self.engines.values())

    def health(self) -> Health:
        group = self._group
        engines = list(self.engines.values())
        healths = [e.health() for e in engines]
        database = [h.database_connected for h in healths]
        feed = [h.change_feed_connected for h in healths if h.change_feed_connected is not None]
        return Health(
            running=self._state is State.RUNNING,
            leader=self.is_leader,
            broker_connected=group.broker_connected if group is not None else None,
            database_connected=False if False in database else (True if database else None),
            change_feed_connected=all(feed) if feed else None,
            database_error=next((h.database_error for h in healths if h.database_error), None),
            broker_error=group.broker_error if group is not None else None,
        )

    def refresh_health(self) -> None:
        """Ping the database now through each shard's engine (the operations server's timer)."""
        for engine in self.engines.values():
            engine.refresh_health()

    def _open(self) -> None:
        cfg = self.config
        log.info(
            "starting sharded harvester %s (%d shards): outbox %r at %s, Kafka %s",
            cfg.name,
            cfg.shards,
            cfg.outbox_table,
            mask_data_source(cfg.data_source),
            mask_kafka_config(cfg.base_kafka_config),
        )
        source = self._binding_source
        self._binding = source if isinstance(source, ShardableBinding) else source()
        self._group = ShardGroup(
            self._kafka, shards=cfg.shards, on_assigned=self._ensure_engine, **group_settings(cfg)
        )
        try:
            self._binding.for_shard(cfg.shards, 0).dispose()  # refuses a table that cannot be sharded
        except MissingGrantError:
            raise  # a privilege to grant, not the table's shape: the leader topic has nothing to add
        except BindingError as e:
            # A change of shards usually needs the table and the leader topic both changed: say both.
            topic = self._group.topic_problem()
            if topic is None:
                raise
            raise BindingError(f"two things keep shards: {cfg.shards} from starting: 1) {e}; 2) {topic}") from e
        delivery_mode(cfg).check(self._kafka, cfg)  # once for every shard
        self._producer = SharedProducer(self._kafka, producer_config(cfg))
        self._group.start()

    def _launch(self) -> None:
        self._thread = threading.Thread(target=self._group_loop, name="pyharvest-shards", daemon=True)
        self._thread.start()

    def _ensure_engine(self, shard: int) -> None:
        """Called on the group's thread when ``shard``'s partition is assigned."""
        with self._lock:
            if shard in self._engines:
                return
        assert self._binding is not None and self._group is not None and self._producer is not None
        lease = self._group.leases[shard]
        engine = HarvestEngine(
            self.config,
            binding=self._binding.for_shard(self.config.shards, shard),
            kafka=self._kafka,
            leadership=lease.bind,
            shard=shard,
            shared_producer=self._producer,  # as its delivery mode sees fit
        )
        engine.set_event_handler(self._emit)
        engine.start()
        with self._lock:
            self._engines[shard] = engine
        log.info("started the engine of shard %d", shard)

    def _group_loop(self) -> None:
        group = self._group
        assert group is not None
        try:
            while not self._stopping.is_set():
                group.pulse()
                self._check_engines()
                self._stopping.wait(group.min_poll_interval or 0.001)
        except BaseException as e:  # noqa: BLE001 - reported through join()
            log.exception("sharded harvester crashed")
            self._crash = e
        finally:
            self._shutdown()

    def _check_engines(self) -> None:
        for shard, engine in self.engines.items():
            if engine.state is State.STOPPED:
                # An engine stops on its own only when it crashed: stop the process's share
                # rather than keep a shard's partition without harvesting it.
                try:
                    engine.join(0)
                except BaseException as e:  # noqa: BLE001 - re-raised by join() of this harvester
                    raise HarvestError(f"the engine of shard {shard} crashed: {one_line(e)}") from e

    def _shutdown(self) -> None:
        self._state = State.STOPPING
        log.info("stopping sharded harvester %s", self.config.name)
        try:
            self._close_resources()
        finally:
            self._state = State.STOPPED
            log.info("sharded harvester %s stopped", self.config.name)
            self._stopped.set()

    def _close_resources(self) -> None:
        group, self._group = self._group, None
        if group is not None:
            try:
                group.close()  # leaving revokes (and quiesces) every shard this process led
            except Exception as e:  # noqa: BLE001 - keep closing the rest
                log.warning("error leaving the leader group: %s", one_line(e))
        for engine in self.engines.values():
            engine.stop()
        for shard, engine in self.engines.items():
            try:
                engine.join()
            except Exception as e:  # noqa: BLE001 - one shard's crash must not leave others running
                log.warning("the engine of shard %d stopped with an error: %s", shard, one_line(e))
                self._crash = self._crash or e
        # After every engine has stopped: they produce through it and purge through the binding.
        producer, self._producer = self._producer, None
        binding, self._binding = self._binding, None
        self._close_each(
            (
                ("producer", producer.close if producer is not None else None),
                ("database binding", binding.dispose if binding is not None else None),
            )
        )
