"""pyharvest: a transactional outbox relay from SQL databases to Kafka.

Write records with :mod:`pyharvest.stasher` inside your own transactions; run
:class:`Harvest` (or the ``reaper`` command) to publish them to Kafka in causal order per
key, at least once, with one leader at a time among any number of processes.
"""

from pyharvest._harvest import Harvest
from pyharvest._version import __version__
from pyharvest.core.config.settings import Config, Limits
from pyharvest.core.engine.harvest import State
from pyharvest.core.errors import BindingError, ConfigError, HarvestError
from pyharvest.core.outbox.records import InvalidRecordError, OutboxRecord
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
    "State",
    "__version__",
]
