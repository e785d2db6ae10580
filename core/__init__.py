"""The MP/R engine, Fast NELI leader election, configuration, events and metrics.

Nothing here imports a database driver, SQLAlchemy or a Kafka client: the engine talks to
the world through :class:`~pyharvest.core.binding.DatabaseBinding` and the protocols of
:mod:`pyharvest.core.kafka`.
"""

from pyharvest.core.binding import DatabaseBinding
from pyharvest.core.config import Config, Limits, LoggingConfig, ReaperConfig
from pyharvest.core.errors import BindingError, ConfigError, HarvestError
from pyharvest.core.events import (
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
from pyharvest.core.harvest import HarvestEngine, State
from pyharvest.core.records import InvalidRecordError, OutboxRecord, validate_record
from pyharvest.core.sharded import ShardedHarvestEngine

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
