"""What ``/healthz`` and ``/readyz`` answer, from the harvester's last known state."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from pyharvest.core.engine.lifecycle import State

if TYPE_CHECKING:
    from pyharvest.core.engine.harvest import HarvestEngine
    from pyharvest.core.engine.sharded import ShardedHarvestEngine

__all__ = ["blocked_report", "health_report", "leader_report", "liveness_report"]


def liveness_report(harvest: HarvestEngine | ShardedHarvestEngine) -> tuple[bool, dict[str, Any]]:
    """``(alive, body)`` for ``/healthz``: alive until the harvester has stopped."""
    state = harvest.state
    alive = state is not State.STOPPED
    return alive, {"status": "alive" if alive else "stopped", "state": state.value}


def blocked_report(harvest: HarvestEngine | ShardedHarvestEngine) -> tuple[int, list[dict[str, Any]]]:
    """``(count, keys)``: how many keys a record Kafka refuses for good holds back, and the
    longest blocked of them (at most 100) as JSON."""
    keys = [
        {
            "key": b.key,
            "topic": b.topic,
            "record_id": b.record_id,
            "error": b.error,
            "attempts": b.attempts,
            "since": datetime.fromtimestamp(b.since, UTC).isoformat(),
            **({"shard": b.shard} if b.shard is not None else {}),
        }
        for b in harvest.blocked_keys
    ]
    return max(harvest.blocked_key_count, len(keys)), keys


def leader_report(harvest: HarvestEngine | ShardedHarvestEngine) -> dict[int, dict[str, Any] | None]:
    """Who leads each shard this process does not, as JSON (None: not read yet): the leader
    topic's last heartbeat names its sender, read at most every few seconds and only when asked
    (:mod:`pyharvest.core.election.leader_watch`)."""
    leaders = getattr(harvest, "leaders", None)
    seen = leaders() if callable(leaders) else {}
    return {
        shard: None if s is None else {
            "name": s.sender.name,
            "host": s.sender.host or None,
            "pid": s.sender.pid,
            "instance_id": s.sender.instance_id or None,
            "last_heartbeat_seconds_ago": round(s.age, 1),
            "text": s.sender.describe(),
        }
        for shard, s in sorted(seen.items())
    }


def health_report(harvest: HarvestEngine | ShardedHarvestEngine) -> tuple[bool, dict[str, Any]]:
    """``(ready, body)`` for ``/readyz``; ``body["down"]`` lists what is not up. A key held
    back by a poison record does not make the process unready (it serves every other key: a
    restart would not help), but ``body["degraded"]`` says so and ``body["blocked_keys"]``
    names them."""
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
    led_by = leader_report(harvest)
    if led_by:  # a standby (of some shards): who leads them
        body["led_by"] = {str(shard): who for shard, who in led_by.items()}
    count, keys = blocked_report(harvest)
    body["degraded"] = bool(count)
    if count:
        body["blocked_key_count"] = count
        body["blocked_keys"] = keys
    return health.ready, body
