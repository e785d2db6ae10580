"""The inbox's engine: its parts wired behind their ports, and the worker's loop.

One responsibility each, as the harvester's engine is split:
:mod:`~pyharvest.core.inbox.loop` (poll, apply, commit when due; rebalances),
:mod:`~pyharvest.core.inbox.partitions` (claims and fences), :mod:`~pyharvest.core.inbox.batch`
(one transaction), :mod:`~pyharvest.core.inbox.recovery` (failures) and
:mod:`~pyharvest.core.inbox.replay` (dead letters). What they reach the world through is
:mod:`~pyharvest.core.inbox.ports`; :class:`pyharvest.inbox.Inbox` builds the SQL and Kafka
bindings from its configuration and runs this engine on a thread of its own.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass

from pyharvest.core.inbox.batch import Batches
from pyharvest.core.inbox.loop import ConsumeLoop
from pyharvest.core.inbox.partitions import Partitions
from pyharvest.core.inbox.ports import BatchHandler, Handler, InboxPorts
from pyharvest.core.inbox.recovery import Recovery
from pyharvest.core.inbox.replay import Replayer
from pyharvest.core.inbox.stats import Counters, InboxStats

__all__ = ["InboxEngine", "InboxSettings"]


@dataclass(frozen=True, slots=True)
class InboxSettings:
    """How the engine behaves (an :class:`~pyharvest.inbox.InboxConfig`'s, resolved)."""

    #: ``stop``: a failing handler stops the inbox; ``dead-letter``: its message is stored.
    error_policy: str
    #: Identities more than this many offsets behind a partition's checkpoint are pruned.
    dedupe_window: int
    #: Prune the dedupe table after this many commits.
    prune_every: int
    #: Most messages in one transaction, and longest a transaction stays open gathering them.
    max_batch: int
    max_duration: float
    #: How long an idle consumer waits for messages per poll.
    poll: float
    #: Pause after a database error before resynchronising from the checkpoints.
    backoff: float
    #: How often the owner of a partition looks for replay requests.
    replay_interval: float


class InboxEngine:
    """The parts of one inbox, wired; :meth:`run` is the worker's loop. ``handler`` applies one
    message, ``batch_handler`` a transaction's messages (give one of the two)."""

    def __init__(
        self,
        ports: InboxPorts,
        handler: Handler | None = None,
        *,
        batch_handler: BatchHandler | None = None,
        settings: InboxSettings,
        stop: threading.Event | None = None,
    ) -> None:
        s = settings
        self.ports = ports
        self.counters = Counters()
        #: Set to stop :meth:`run`; the open batch then commits.
        self.stop = stop or threading.Event()
        self.partitions = Partitions(ports, stop=self.stop, backoff=s.backoff)
        self.batches = Batches(
            ports,
            handler,
            batch_handler=batch_handler,
            partitions=self.partitions,
            counters=self.counters,
            error_policy=s.error_policy,
            dedupe_window=s.dedupe_window,
            prune_every=s.prune_every,
        )
        self.recovery = Recovery(
            ports,
            partitions=self.partitions,
            batches=self.batches,
            counters=self.counters,
            stop=self.stop,
            backoff=s.backoff,
        )
        self.replayer = Replayer(
            ports,
            handler,
            batch_handler=batch_handler,
            partitions=self.partitions,
            drop=self.batches.drop,
            counters=self.counters,
            stop=self.stop,
            interval=s.replay_interval,
        )
        self.loop = ConsumeLoop(
            ports,
            partitions=self.partitions,
            batches=self.batches,
            recovery=self.recovery,
            replayer=self.replayer,
            max_batch=s.max_batch,
            max_duration=s.max_duration,
            poll=s.poll,
        )

    def subscribe(self, topics: Sequence[str]) -> None:
        """Join the consumer group: rebalances reach the loop from then on."""
        self.ports.consumer.subscribe(topics, self.loop)

    def run(self) -> None:
        """Poll and apply until :attr:`stop` is set, then commit what is open. An error that
        stops it is raised, once what was open is rolled back."""
        loop = self.loop
        try:
            while not self.stop.is_set():
                loop.step()
            loop.finish()
        except BaseException:
            loop.abandon()
            raise

    @property
    def stats(self) -> InboxStats:
        return self.counters.snapshot(self.partitions.owned)

    def close(self) -> None:
        """Leave the group (the revocation inside finds nothing open) and forget the partitions."""
        try:
            self.ports.consumer.close()
        finally:
            self.partitions.clear()
