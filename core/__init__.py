"""The MP/R engine, Fast NELI leader election, configuration, events and metrics.

Nothing here imports a database driver, SQLAlchemy or a Kafka client: the engine talks to
the world through :class:`~pyharvest.core.ports.database.DatabaseBinding` and the protocols of
:mod:`pyharvest.core.ports.kafka`.
"""

from pyharvest.core.config.settings import Config, Limits, LoggingConfig, ReaperConfig
from pyharvest.core.engine.harvest import HarvestEngine, State
from pyharvest.core.engine.sharded import ShardedHarvestEngine
from pyharvest.core.errors import BindingError, ConfigError, HarvestError
from pyharvest.core.outbox.records import InvalidRecordError, OutboxRecord, validate_record
from pyharvest.core.ports.database import DatabaseBinding
from pyharvest.core.telemetry.events import (
    DeliveryFailed,
    Event,
    EventHandler,
    LeaderAcquired,
    LeaderFenced,
    LeaderRefreshed,
    LeaderRevoked,
    MeterRead,
    MeterStats,
    RecordQuarantined,
)

__all__ = [
    "BindingError",
    "Config",
    "ConfigError",
    "DatabaseBinding",
    "DeliveryFailed",
    "Event",
    "EventHandler",
    "HarvestEngine",
    "HarvestError",
    "InvalidRecordError",
    "LeaderAcquired",
    "LeaderFenced",
    "LeaderRefreshed",
    "LeaderRevoked",
    "Limits",
    "LoggingConfig",
    "MeterRead",
    "MeterStats",
    "OutboxRecord",
    "ReaperConfig",
    "RecordQuarantined",
    "ShardedHarvestEngine",
    "State",
    "validate_record",
]
