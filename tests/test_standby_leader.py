"""A standby's status page and /readyz say which process leads (issue 49), on Apache Kafka:
three reapers, the standbys name the leader from the leader topic's last heartbeat; after the
leader stops, the standby still running names the new one."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest

pytest.importorskip("prometheus_client")

from tests.helpers.ops import get  # noqa: E402
from tests.helpers.reapers import ReaperProcess  # noqa: E402
from tests.helpers.waiting import wait_until  # noqa: E402


def status(base: str) -> dict[str, Any]:
    return json.loads(get(base + "/status")[1])


@pytest.mark.kafka
@pytest.mark.timeout(300)
def test_a_standby_names_the_leader_and_after_a_hand_over_the_new_one(tmp_path, kafka_bootstrap):
    from pyharvest.bindings.sql import create_outbox_table

    url = f"sqlite:///{tmp_path / 'outbox.db'}"
    create_outbox_table(url, "outbox")
    group = f"led-by-{uuid.uuid4().hex[:8]}"

    def config(name: str) -> dict[str, Any]:
        return {
            "harvest": {
                "name": name,
                "baseKafkaConfig": {"bootstrap.servers": kafka_bootstrap},
                "leaderGroupID": group,
                "dataSource": url,
                "limits": {"heartbeatTimeout": "2s", "minPollInterval": "50ms"},
            },
            "metrics": {"address": "127.0.0.1", "port": 0},
            "logging": {"level": "Info"},
        }

    reapers = {name: ReaperProcess(config(name), tmp_path, name) for name in ("reaper-a", "reaper-b", "reaper-c")}
    try:
        bases = {name: r.ops_url() for name, r in reapers.items()}

        def leaders() -> list[str]:
            return [n for n, b in bases.items() if n in reapers and status(b)["shards"][0]["role"] == "leader"]

        wait_until(lambda: len(leaders()) == 1, 90, "one reaper to lead")
        (leader,) = leaders()
        standbys = [n for n in reapers if n != leader]

        def named(base: str) -> str | None:
            who = status(base)["shards"][0].get("led_by")
            return who["name"] if who else None

        for n in standbys:
            wait_until(lambda n=n: named(bases[n]) == leader, 60, f"{n}'s status to name {leader}")
        shard = status(bases[standbys[0]])["shards"][0]["led_by"]
        assert shard["pid"] == reapers[leader].proc.pid and shard["last_heartbeat_seconds_ago"] < 60, shard
        code, body = get(bases[standbys[0]] + "/readyz")
        assert json.loads(body)["led_by"]["0"]["name"] == leader, (code, body)
        page = get(bases[standbys[0]] + "/")[1]
        assert f"led by {leader} (" in page and "last heartbeat" in page, page
        # The leader's own page names no other leader.
        assert "led_by" not in status(bases[leader])["shards"][0]

        reapers.pop(leader).stop()
        wait_until(lambda: len(leaders()) == 1, 90, "a standby to take over")
        (new_leader,) = leaders()
        (remaining,) = [n for n in reapers if n != new_leader]
        wait_until(lambda: named(bases[remaining]) == new_leader, 60, f"{remaining}'s status to name {new_leader}")
    finally:
        for r in reapers.values():
            r.stop()
