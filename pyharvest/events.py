"""What a running harvester reports: the events it emits to the handler given to
:class:`~pyharvest.Harvest` (``on_event=`` or :meth:`~pyharvest.Harvest.set_event_handler`),
its :class:`State` and its :class:`Health`, and the :class:`BlockedKey` entries of
:attr:`~pyharvest.Harvest.blocked_keys`.

Handlers run on the harvester's own threads, synchronously: a handler of
:class:`LeaderRevoked` may block to wrap up leader-only work before a new leader is elected;
a handler of :class:`LeaderFenced` must return promptly, as another leader may already be
starting. Match on the classes::

    def on_event(event: Event) -> None:
        if isinstance(event, DeliveryFailed) and not event.retriable:
            alert(event)
"""

from pyharvest._public import publish
from pyharvest.core.engine.lifecycle import State
from pyharvest.core.publishing.blocked_keys import BlockedKey
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
from pyharvest.core.telemetry.health import Health

__all__ = [
    "BlockedKey",
    "DeliveryFailed",
    "Event",
    "EventHandler",
    "Health",
    "LeaderAcquired",
    "LeaderFenced",
    "LeaderRefreshed",
    "LeaderRevoked",
    "MeterRead",
    "MeterStats",
    "RecordQuarantined",
    "State",
]

publish(__name__, globals(), __all__)
