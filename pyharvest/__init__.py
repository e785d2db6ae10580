"""pyharvest: a transactional outbox relay from SQL databases to Kafka.

Write records with :mod:`pyharvest.stasher` inside your own transactions; run
:class:`Harvest` (or the ``reaper`` command) to publish them to Kafka in causal order per
key, at least once, with one leader at a time among any number of processes.
"""

from pyharvest._harvest import Harvest, ShardedHarvest
from pyharvest._version import __version__
from pyharvest.core.config import Config, Limits
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
from pyharvest.core.harvest import State
from pyharvest.core.records import InvalidRecordError, OutboxRecord
from pyharvest.stasher.errors import (
    KeyTooLongError,
    OutboxTableChangedError,
    OutboxTableMissingError,
    RecordTooLargeError,
)

__all__ = [
    "BindingError",
    "Config",
    "ConfigError",
    "DeliveryFailed",
    "Event",
    "EventHandler",
    "Harvest",
    "HarvestError",
    "InvalidRecordError",
    "KeyTooLongError",
    "LeaderAcquired",
    "LeaderFenced",
    "LeaderRefreshed",
    "LeaderRevoked",
    "Limits",
    "MeterRead",
    "MeterStats",
    "OutboxRecord",
    "OutboxTableChangedError",
    "OutboxTableMissingError",
    "RecordQuarantined",
    "RecordTooLargeError",
    "ShardedHarvest",
    "State",
    "__version__",
]
