"""What the status page shows, as one JSON-able mapping: ``GET /`` with ``Accept:
application/json``, or ``GET /status``; :mod:`.status_page` renders the same as HTML.

Everything comes from what the process already knows (the engine's state and the keys it holds
back, the last count of the backlog, the last read of the age and the quarantine): building it never waits on the
database or the broker.
"""

from __future__ import annotations

import os
import shlex
import socket
import time
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any, Protocol

from pyharvest.bindings.ops.probes import blocked_report, health_report
from pyharvest.bindings.ops.watch import harvest_engines
from pyharvest.core.config.settings import mask_data_source
from pyharvest.core.engine.sharded import ShardedHarvestEngine

if TYPE_CHECKING:
    from pyharvest.bindings.ops.collector import BacklogCounter
    from pyharvest.bindings.ops.shard_collector import ShardBacklog
    from pyharvest.bindings.ops.watch import OutboxWatch
    from pyharvest.core.engine.harvest import HarvestEngine


class Served(Protocol):
    """What the status page reads of the server (:class:`~pyharvest.bindings.ops.server.OpsServer`)."""

    harvest: HarvestEngine | ShardedHarvestEngine
    backlog: BacklogCounter | ShardBacklog | None
    watch: OutboxWatch | None
    command_target: str | None
    started_at: float

__all__ = ["ENDPOINTS", "quarantine_commands", "status_report"]

#: What the server answers, as the index at ``/`` listed them before the status page.
ENDPOINTS = ["/", "/status", "/metrics", "/healthz", "/readyz"]

def _version() -> str:
    try:
        return version("pyharvest")
    except PackageNotFoundError:
        return "unknown"


def quarantine_commands(target: str, key: str) -> dict[str, str]:
    """The ``reaper quarantine`` command lines that replay or discard ``key``."""
    quoted = shlex.quote(key)
    return {
        action: f"reaper quarantine {action} {target} --key {quoted}" for action in ("replay", "discard")
    }


def default_command_target(config: Any) -> str:
    """How ``reaper quarantine`` finds this outbox, when the server was not told (``-f FILE``):
    the data source with its password masked, which the operator fills in."""
    return (
        f"--data-source {shlex.quote(mask_data_source(config.data_source))} "
        f"--table {shlex.quote(config.outbox_table)}"
    )


def status_report(ops: Served) -> dict[str, Any]:
    """The status of the process ``ops`` serves, as the page and its JSON show it."""
    harvest, watch, backlog = ops.harvest, ops.watch, ops.backlog
    cfg = harvest.config
    ready, health = health_report(harvest)
    led_by = {int(shard): who for shard, who in health.get("led_by", {}).items()}
    blocked_count, blocked = blocked_report(harvest)
    shards: list[dict[str, Any]] = []
    if isinstance(harvest, ShardedHarvestEngine):
        engines = harvest.engines
        counts = getattr(backlog, "values", {}) if backlog is not None else {}
        for shard in range(cfg.shards):
            engine = engines.get(shard)
            shards.append({
                "shard": shard,
                "role": "leader" if engine is not None and engine.is_leader else "standby",
                **({"led_by": led_by[shard]} if shard in led_by else {}),
                "in_flight_records": engine.in_flight_records if engine is not None else 0,
                "backlog_records": counts.get(shard),
            })
        backlog_total = sum(counts.values()) if counts else None
    else:
        backlog_total = getattr(backlog, "value", None)
        shards.append({
            "shard": 0,
            "role": "leader" if harvest.is_leader else "standby",
            **({"led_by": led_by[0]} if 0 in led_by else {}),
            "in_flight_records": harvest.in_flight_records,
            "backlog_records": backlog_total,
        })
    metrics = [e.metrics for e in harvest_engines(harvest)]
    target = ops.command_target or default_command_target(cfg)
    quarantined = None
    if watch is not None and watch.quarantined is not None:
        quarantined = [
            {
                "key": q.key,
                "record_id": q.record_id,
                "topic": q.topic,
                "error": q.error,
                "attempts": q.attempts,
                "quarantine_time": q.quarantine_time.isoformat() if q.quarantine_time else None,
                "commands": quarantine_commands(target, q.key),
            }
            for q in watch.quarantined
        ]
    return {
        "endpoints": ENDPOINTS,
        "process": {
            "name": cfg.name,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "version": _version(),
            "uptime_seconds": round(time.time() - ops.started_at, 1),
            "leader_group_id": cfg.leader_group_id,
            "outbox_table": cfg.outbox_table,
            "delivery": cfg.delivery,
            "poison_policy": cfg.poison_policy,
        },
        "status": "degraded" if ready and blocked_count else health["status"],
        "ready": ready,
        "degraded": bool(blocked_count),
        "blocked_key_count": blocked_count,
        "blocked_keys": blocked,
        "health": health,
        "shards": shards,
        "backlog_records": backlog_total,
        "backlog_interval_seconds": backlog.interval if backlog is not None else None,
        "oldest_record_age_seconds": watch.age if watch is not None else None,
        "cleanup_horizon": _horizon(watch.horizon if watch is not None else None),
        "records_published_total": sum(m.records_purged for m in metrics),
        "records_quarantined_total": sum(m.records_quarantined for m in metrics),
        "quarantined": quarantined,
        "history": [
            {
                "time": s.time,
                "published_per_second": s.published_per_second,
                "latency_p50_seconds": s.latency_p50_seconds,
                "latency_p99_seconds": s.latency_p99_seconds,
                "oldest_record_age_seconds": s.oldest_record_age_seconds,
            }
            for s in (watch.samples() if watch is not None else ())
        ],
        "sample_interval_seconds": watch.interval if watch is not None else None,
    }


def _horizon(horizon: Any) -> dict[str, Any] | None:
    """The clean-up horizon as the status page shows it; None while unknown."""
    if horizon is None:
        return None
    return {"holder": horizon.holder, "age_seconds": horizon.age_seconds, "behind": horizon.behind,
            "behind_unit": horizon.behind_unit}
