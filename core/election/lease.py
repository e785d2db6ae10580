"""One shard's leadership as its engine sees it: what the engine needs of its leader election
(:class:`Leadership`), the statuses it is told of, and :class:`ShardLease`, the lease of one
shard of the process's member of the leader group (:class:`~pyharvest.core.election.neli.ShardGroup`).

Apart from the group so that the engine's side of election reads on its own; the lease knows
its group only through :class:`LeaseGroup`, the three things it asks of it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from enum import Enum
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from pyharvest.core.election.leader_watch import LeaderSeen

__all__ = ["LeaderStatus", "Leadership", "LeaseGroup", "ShardLease", "StatusHandler"]


class LeaderStatus(Enum):
    ACQUIRED = "acquired"
    REVOKED = "revoked"
    FENCED = "fenced"


class Leadership(Protocol):
    """What the engine needs of its leader election: :class:`Neli` for a single leader, a
    :class:`ShardLease` for one shard of a sharded outbox."""

    def start(self) -> None: ...

    def pulse(self) -> bool:
        """Poll if due, and return whether this process leads (now)."""
        ...

    def poll_due(self) -> float: ...

    @property
    def since_last_poll(self) -> float: ...

    @property
    def broker_connected(self) -> bool | None: ...

    @property
    def broker_error(self) -> str | None:
        """Why this member cannot lead although the broker answers; None if nothing is wrong."""
        ...

    def leaders(self) -> dict[int, LeaderSeen | None]:
        """Who leads the shards this process does not, as their last heartbeats say."""
        ...

    def close(self) -> None: ...


StatusHandler = Callable[[LeaderStatus], None]


class LeaseGroup(Protocol):
    """What a :class:`ShardLease` reads of its group."""

    @property
    def min_poll_interval(self) -> float: ...

    @property
    def since_last_poll(self) -> float: ...

    @property
    def broker_connected(self) -> bool | None: ...

    @property
    def broker_error(self) -> str | None: ...


class ShardLease:
    """Leadership of one shard as its engine sees it (the protocol of :class:`Neli`)."""

    def __init__(self, group: LeaseGroup, shard: int) -> None:
        self.group = group
        self.shard = shard
        self._on_status: StatusHandler = lambda status: None
        self._state = threading.Lock()
        # Status changes reach the engine one at a time and in order, from either thread.
        self._delivering = threading.RLock()
        self._leading = False
        self._announced = False
        self._last_pulse = float("-inf")

    def bind(self, on_status: StatusHandler) -> ShardLease:
        self._on_status = on_status
        return self

    # -- what the engine calls, on its main thread --------------------------------------

    def start(self) -> None:
        """The group is started by its owner; nothing to join here."""

    def pulse(self) -> bool:
        self._last_pulse = time.monotonic()
        with self._delivering:
            with self._state:
                due = self._leading and not self._announced
                self._announced = self._announced or due
            if due:
                self._on_status(LeaderStatus.ACQUIRED)
        return self._leading

    def poll_due(self) -> float:
        return max(0.0, self._last_pulse + self.group.min_poll_interval - time.monotonic())

    @property
    def is_leader(self) -> bool:
        return self._leading

    @property
    def since_last_poll(self) -> float:
        return self.group.since_last_poll

    @property
    def broker_connected(self) -> bool | None:
        return self.group.broker_connected

    @property
    def broker_error(self) -> str | None:
        return self.group.broker_error

    def leaders(self) -> dict[int, LeaderSeen | None]:
        """Nothing: a sharded engine's owner reads who leads every shard off the group."""
        return {}

    def close(self) -> None:
        """The group is closed by its owner."""

    # -- what the group calls, on its thread --------------------------------------------

    def acquire(self) -> None:
        with self._state:
            self._leading = True

    def lose(self, status: LeaderStatus) -> None:
        """Stop leading: the engine steps down and quiesces before this returns."""
        with self._delivering:
            with self._state:
                was_announced, self._leading, self._announced = self._announced, False, False
            if was_announced:
                self._on_status(status)
