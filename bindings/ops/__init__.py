"""Operations: a status page, Prometheus metrics and health probes for a running harvester.

The ``reaper`` command starts this server when ``reaper.yaml`` has a ``metrics:`` section;
embedded users call :func:`start_ops_server` themselves, or register a
:class:`HarvestCollector` with a registry of their own. Needs the ``metrics`` extra
(``pip install 'pyharvest[metrics]'``, i.e. ``prometheus_client``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

from pyharvest.bindings.ops.config import DEFAULT_ADDRESS, DEFAULT_PORT, OpsConfig
from pyharvest.core.errors import ConfigError

if TYPE_CHECKING:
    from pyharvest.bindings.ops.collector import BacklogCounter, HarvestCollector
    from pyharvest.bindings.ops.server import OpsServer
    from pyharvest.bindings.ops.shard_collector import ShardBacklog
    from pyharvest.core.engine.harvest import HarvestEngine
    from pyharvest.core.engine.sharded import ShardedHarvestEngine

class Runs(Protocol):
    """A façade over a harvester (``pyharvest.Harvest``): what it runs is its ``runner``."""

    @property
    def runner(self) -> HarvestEngine | ShardedHarvestEngine: ...


__all__ = [
    "DEFAULT_ADDRESS",
    "DEFAULT_PORT",
    "BacklogCounter",
    "HarvestCollector",
    "OpsConfig",
    "OpsServer",
    "start_ops_server",
]


def start_ops_server(
    harvest: HarvestEngine | ShardedHarvestEngine | Runs,
    section: Mapping[str, Any] | OpsConfig | None,
    *,
    process_metrics: bool = True,
    command_target: str | None = None,
) -> OpsServer | None:
    """Serve the status page at ``/``, ``/metrics``, ``/healthz`` and ``/readyz`` for
    ``harvest`` on a background thread.

    ``section`` is the ``metrics:`` mapping of ``reaper.yaml`` (or an :class:`OpsConfig`).
    Returns ``None`` when it is ``None`` or says ``enabled: false``; otherwise a running
    :class:`OpsServer` — call its ``stop()`` when the harvester stops. It may be started
    before ``harvest.start()``: readiness answers 503 until the harvester runs.

    Raises :class:`~pyharvest.core.errors.ConfigError` naming the key (``metrics.port``...)
    for an invalid section or a missing ``prometheus_client``, and
    :class:`~pyharvest.core.errors.HarvestError` when the port cannot be bound.
    ``process_metrics`` adds the standard ``process_*``, ``python_gc_*`` and
    ``python_info`` metrics. ``command_target`` is how the status page's ``reaper quarantine``
    commands name the outbox (``reaper`` passes ``-f reaper.yaml``); by default
    ``--data-source`` with the password masked, and ``--table``.
    """
    if section is None:
        return None
    config = section if isinstance(section, OpsConfig) else OpsConfig.from_mapping(section)
    if not config.enabled:
        return None
    try:
        from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector
    except ImportError:
        raise ConfigError(
            "metrics", "the metrics server needs prometheus_client: pip install 'pyharvest[metrics]'"
        ) from None
    from pyharvest.bindings.ops.collector import BacklogCounter, HarvestCollector
    from pyharvest.bindings.ops.histograms import publish_latency
    from pyharvest.bindings.ops.server import OpsServer
    from pyharvest.bindings.ops.watch import OutboxWatch, harvest_engines
    from pyharvest.core.engine.harvest import HarvestEngine
    from pyharvest.core.engine.sharded import ShardedHarvestEngine

    if not isinstance(harvest, HarvestEngine | ShardedHarvestEngine):
        harvest = harvest.runner
    registry = CollectorRegistry()
    engine = harvest
    watch = OutboxWatch(engine, config.age_interval, lambda: publish_latency(harvest_engines(engine)))
    backlog: BacklogCounter | ShardBacklog | None
    if isinstance(harvest, ShardedHarvestEngine):
        from pyharvest.bindings.ops.shard_collector import ShardBacklog, ShardedHarvestCollector

        backlog = ShardBacklog(harvest, config.backlog_interval) if config.backlog_interval else None
        registry.register(ShardedHarvestCollector(harvest, backlog=backlog, watch=watch))
    else:
        backlog = BacklogCounter(harvest, config.backlog_interval) if config.backlog_interval else None
        registry.register(HarvestCollector(harvest, backlog=backlog, watch=watch))
    if process_metrics:
        ProcessCollector(registry=registry)
        PlatformCollector(registry=registry)
        GCCollector(registry=registry)
    return OpsServer(
        harvest, registry, config.address, config.port, backlog, watch=watch, command_target=command_target
    ).start()


def __getattr__(name: str) -> Any:
    # The collector and the server import prometheus_client; load them only when asked for.
    if name in ("BacklogCounter", "HarvestCollector"):
        from pyharvest.bindings.ops import collector

        return getattr(collector, name)
    if name == "OpsServer":
        from pyharvest.bindings.ops import server

        return server.OpsServer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
