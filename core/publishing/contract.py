"""What the engine asks of a delivery mode: the one interface through which the main loop and
the delivery thread reach Kafka, whichever ``delivery`` the config names.

A mode is a pipeline split by responsibility (as aiokafka's producer is): its :attr:`window`
is what the main loop hands marked records to and waits on; :meth:`DeliveryMode.serve` is the
delivery thread, which settles what the window sent. The engine builds its mode once, from
:func:`pyharvest.core.publishing.modes.delivery_mode`; inside the engine nothing else asks which mode
runs (outside it, the ACL listing, the status page and the start-up check read
``config.delivery`` for what each mode needs of Kafka).

* :class:`~pyharvest.core.publishing.at_least_once.AtLeastOnce`: the key window, the sender and
  the delivery thread that settles acknowledgements;
* :class:`~pyharvest.core.publishing.exactly_once.ExactlyOnce`: a transaction window and the
  publisher that serves it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from pyharvest.core.config.settings import Config
from pyharvest.core.outbox.records import OutboxRecord
from pyharvest.core.ports.database import DatabaseBinding
from pyharvest.core.ports.kafka import KafkaClients
from pyharvest.core.publishing.blocked_keys import BlockedKeys
from pyharvest.core.publishing.shared_producer import SharedProducer
from pyharvest.core.telemetry.events import Event
from pyharvest.core.telemetry.metrics import HarvestMetrics
from pyharvest.core.telemetry.spans import BatchSpans

__all__ = ["DeliveryMode", "DeliveryModeType", "ModeContext", "Window"]


@dataclass(frozen=True, slots=True)
class ModeContext:
    """What an engine gives the delivery mode it builds."""

    config: Config
    kafka: KafkaClients
    metrics: HarvestMetrics
    #: The engine's shard, when the outbox is sharded.
    shard: int | None
    #: How the mode reports events (the engine's event handler).
    emit: Callable[[Event], None]
    #: Past it, settling gives up (the shutdown deadline; None while running).
    deadline: Callable[[], float | None]
    #: The engine's trace spans: one per published batch and per purge (the mark's is the engine's).
    spans: BatchSpans
    #: The one data producer a sharded process's shards share, if any.
    shared_producer: SharedProducer | None = None
    #: The keys held back by delivery errors, which the mode's settlement keeps (the engine
    #: shows them, and frees those a mark finds gone).
    blocked: BlockedKeys = field(default_factory=BlockedKeys)


class Window(Protocol):
    """The in-flight window as the main loop sees it: the records it holds (bounded by
    ``maxInFlightRecords``), whether records may go out now, and the waits on it. Every
    method is safe to call from any thread."""

    @property
    def in_flight(self) -> int:
        """Records handed over and not yet settled in the database."""
        ...

    @property
    def parked(self) -> int:
        """Marked records parked in memory behind their key's in-flight record."""
        ...

    @property
    def free(self) -> int:
        """Room left for newly marked records."""
        ...

    @property
    def force_remark(self) -> bool:
        """A remark is due: nothing more goes out under this leader id (invariant 3)."""
        ...

    def in_flight_keys(self) -> list[str]: ...

    def lead(self) -> None:
        """Send under a new leader id (elected, or a remark): the remark that was due starts."""
        ...

    def stop_leading(self) -> None: ...

    def raise_remark(self) -> None: ...

    def may_mark(self, wait: float) -> bool:
        """Whether the main loop may mark now; may wait up to ``wait`` seconds to know."""
        ...

    def begin_mark(self) -> None:
        """A mark is about to read the table: what it returns is dispatched next."""
        ...

    def dispatch(self, records: Sequence[OutboxRecord]) -> None:
        """Take newly marked records; none while not leading or a remark is due (they stay
        marked, and the remark or the next leader takes them again)."""
        ...

    def wait_for_room(self, threshold: int, timeout: float) -> None: ...

    def quiesce(self, reason: str, deadline: float | None, delivering: Callable[[], bool]) -> None:
        """Stop sending and wait until nothing is in flight, the ``deadline`` passes or the
        delivery thread is gone (``delivering()`` is false)."""
        ...

    def wake(self) -> None:
        """Wake whoever waits on the window (a stop, or the delivery thread gone)."""
        ...


class DeliveryMode(Protocol):
    """A delivery mode of one engine (one outbox, or one shard of it)."""

    @property
    def window(self) -> Window: ...

    def open(self, binding: DatabaseBinding) -> None:
        """Connect what the mode needs before the threads start."""
        ...

    def serve(self, binding: DatabaseBinding, done: threading.Event) -> None:
        """The delivery thread: settle what the window sent, until ``done`` is set and
        nothing is left."""
        ...

    def on_elected(self) -> None:
        """Elected, before the new leader id: whatever a new term needs first."""
        ...

    def abandon(self) -> float | None:
        """Fenced by leader election: nothing handed over may reach Kafka from now on. Returns
        how long the quiesce that follows may wait (a monotonic deadline; None: until every
        record is settled)."""
        ...

    def before_remark(self) -> float:
        """Called with nothing in flight, before a remark: repair what the failures broke;
        returns how long to pause first (a record Kafka refused for good would otherwise be
        retried in a tight loop)."""
        ...

    def close(self) -> None:
        """Release what :meth:`open` took, once the delivery thread has ended."""
        ...


class DeliveryModeType(Protocol):
    """A delivery mode's class: how the engine builds one, and what it checks once per process."""

    def __call__(self, context: ModeContext) -> DeliveryMode: ...

    def check(self, kafka: KafkaClients, config: Config) -> None:
        """Refuse to start where the mode cannot work; run once per process, before any
        engine opens."""
        ...
