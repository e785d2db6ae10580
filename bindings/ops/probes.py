"""What ``/healthz`` and ``/readyz`` answer, from the harvester's last known state."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pyharvest.core.engine.lifecycle import State

if TYPE_CHECKING:
    from pyharvest.core.engine.harvest import HarvestEngine
    from pyharvest.core.engine.sharded import ShardedHarvestEngine

__all__ = ["health_report", "liveness_report"]


def liveness_report(harvest: HarvestEngine | ShardedHarvestEngine) -> tuple[bool, dict[str, Any]]:
    """``(alive, body)`` for ``/healthz``: alive until the harvester has stopped."""
    state = harvest.state
    alive = state is not State.STOPPED
    return alive, {"status": "alive" if alive else "stopped", "state": state.value}


def health_report(harvest: HarvestEngine | ShardedHarvestEngine) -> tuple[bool, dict[str, Any]]:
    """``(ready, body)`` for ``/readyz``; ``body["down"]`` lists what is not up."""
    health = harvest.health()
    down = []
    if not health.running:
        down.append("harvester")
    if health.broker_connected is False or health.broker_error is not None:
        down.append("broker")
    if health.database_connected is False:
        down.append("database")
    body: dict[str, Any] = {
        "status": "ready" if health.ready else "not ready",
        "state": harvest.state.value,
        "role": "leader" if health.leader else "standby",
        "running": health.running,
        "broker_connected": health.broker_connected,
        "database_connected": health.database_connected,
        # PostgreSQL's LISTEN connection; None where the binding polls only. While it is down
        # the harvester polls, so it does not make the process unready.
        "change_feed_connected": health.change_feed_connected,
    }
    if down:
        body["down"] = down
    errors = {}
    if health.broker_error is not None:  # Kafka answers but refuses the heartbeats (below min ISR)
        errors["broker"] = health.broker_error
    if health.database_connected is False and health.database_error:
        errors["database"] = health.database_error
    if errors:
        body["errors"] = errors
    return health.ready, body
