"""What every harvester shares: its life cycle and its events.

A harvester runs in the background from :meth:`Lifecycle.start` until :meth:`Lifecycle.stop`;
:meth:`Lifecycle.join` waits for it and re-raises whatever crashed it, and ``with`` does both.
:class:`~pyharvest.core.engine.harvest.HarvestEngine` (one outbox, or one shard of it) and
:class:`~pyharvest.core.engine.sharded.ShardedHarvestEngine` (the shards this process leads) differ
only in what runs.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from enum import Enum
from typing import Self

from pyharvest.core.config.kafka_origins import explain_harvest_refusal
from pyharvest.core.config.settings import Config
from pyharvest.core.errors import HarvestError, KafkaPropertyError
from pyharvest.core.telemetry.events import Event, EventHandler
from pyharvest.core.telemetry.logs import log, one_line

__all__ = ["Lifecycle", "State"]


class State(Enum):
    """Where a harvester is in its life (``harvest.state``): created, running (leading or on
    standby), stopping (in-flight records given ``limits.shutdownTimeout``) or stopped."""

    CREATED = "created"
    RUNNING = "running"
    STOPPING = "stopping"
    STOPPED = "stopped"


class Lifecycle:
    """The life cycle and event delivery of a harvester. Subclasses connect in :meth:`_open`,
    undo a half-done :meth:`_open` in :meth:`_close_resources`, and start their threads in
    :meth:`_launch`."""

    config: Config

    def __init__(self) -> None:
        self._state = State.CREATED
        self._stopping = threading.Event()
        self._stopped = threading.Event()
        self._crash: BaseException | None = None
        self._event_handler: EventHandler = lambda e: None

    @property
    def state(self) -> State:
        return self._state

    def start(self) -> None:
        """Connect and start harvesting in the background. Errors at start-up (unreachable
        database, missing table, unreachable broker) are raised here."""
        if self._state is not State.CREATED:
            raise HarvestError(f"cannot start a harvester that is {self._state.value}")
        try:
            self._open()
        except BaseException as e:
            self._close_resources()
            self._state = State.STOPPED
            self._stopped.set()
            if isinstance(e, KafkaPropertyError):
                raise explain_harvest_refusal(e, self.config) from None
            raise
        self._state = State.RUNNING
        self._launch()

    def _open(self) -> None:
        raise NotImplementedError

    def _launch(self) -> None:
        raise NotImplementedError

    def _close_resources(self) -> None:
        raise NotImplementedError

    def set_event_handler(self, handler: EventHandler) -> None:
        """Register the callback for :mod:`pyharvest.events`, before or after :meth:`start`."""
        self._event_handler = handler

    def stop(self) -> None:
        """Ask the harvester to stop; returns at once. Use :meth:`join` to wait."""
        if self._state is State.CREATED:
            self._state = State.STOPPED
            self._stopped.set()
            return
        self._stopping.set()
        self._wake()

    def join(self, timeout: float | None = None) -> bool:
        """Wait until stopped; re-raise whatever crashed it. Returns False on timeout."""
        if not self._stopped.wait(timeout):
            return False
        if self._crash is not None:
            raise self._crash
        return True

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
        self.join()

    @staticmethod
    def _close_each(closers: Iterable[tuple[str, Callable[[], object] | None]]) -> None:
        """Close every resource named, in order, logging what fails and closing the rest."""
        for what, close in closers:
            if close is None:
                continue
            try:
                close()
            except Exception as e:  # noqa: BLE001 - keep closing the rest
                log.warning("error closing %s: %s", what, one_line(e))

    def _wake(self) -> None:
        """Wake the harvester's threads so they see the stop request (if they wait on more)."""

    def _emit(self, event: Event) -> None:
        try:
            self._event_handler(event)
        except Exception:  # noqa: BLE001 - a faulty handler must not break harvesting
            log.exception("event handler raised on %r", event)
