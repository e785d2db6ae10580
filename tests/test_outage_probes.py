"""An operator's view of a database outage, on real databases and a real broker: the probes
answer at once from the last known state (503, with what is down and why), a table dropped
mid-run is reported as at start (not ready, with the ``init-db`` hint), and a failure that
lasts is logged once per cause with a count, not twice a second."""

from __future__ import annotations

import json
import logging
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import sqlalchemy as sa

pytest.importorskip("prometheus_client")

from pyharvest import Config, Harvest, Limits  # noqa: E402
from pyharvest.bindings.ops import OpsServer, start_ops_server  # noqa: E402
from pyharvest.bindings.sql import create_outbox_table  # noqa: E402
from pyharvest.core.telemetry.health import PING_INTERVAL  # noqa: E402
from tests.helpers.faults.proxy import FaultProxy  # noqa: E402
from tests.helpers.waiting import wait_until  # noqa: E402

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(180)]

#: What a probe must answer within, whatever the database does: a generous bound on a path
#: that never waits on it.
ANSWER_WITHIN = 1.0


def answer(url: str) -> tuple[int, str]:
    """Status and body; raises (failing the test) if no answer comes within ANSWER_WITHIN."""
    try:
        with urllib.request.urlopen(url, timeout=ANSWER_WITHIN) as r:  # noqa: S310 - loopback only
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def readyz(ops: OpsServer) -> tuple[int, dict]:
    status, body = answer(ops.url + "/readyz")
    return status, json.loads(body)


def config(kafka_config: dict, url: str, table: str, **limits: float) -> Config:
    return Config(
        base_kafka_config=dict(kafka_config),
        leader_group_id=f"outage-{uuid.uuid4().hex[:8]}",
        data_source=url,
        outbox_table=table,
        limits=Limits(heartbeat_timeout=2.0, min_poll_interval=0.05, **limits),
    )


@contextmanager
def harvesting(cfg: Config) -> Iterator[tuple[Harvest, OpsServer]]:
    harvest = Harvest(cfg)
    ops = start_ops_server(harvest, {"address": "127.0.0.1", "port": 0})
    assert ops is not None
    try:
        with harvest:
            wait_until(lambda: harvest.is_leader and readyz(ops)[0] == 200, 30, "a ready leader")
            yield harvest, ops
    finally:
        ops.stop()


@contextmanager
def proxied(database_url: str, dialect: str) -> Iterator[tuple[FaultProxy, str]]:
    if dialect == "sqlite":
        pytest.skip("SQLite is a file: there is no connection to cut")
    url = sa.make_url(database_url)
    with FaultProxy(upstream=(url.host or "127.0.0.1", url.port or 5432)) as proxy:
        yield proxy, url.set(host="127.0.0.1", port=proxy.port).render_as_string(hide_password=False)


def test_probes_answer_at_once_while_the_database_is_black_holed(  # type: ignore[no-untyped-def]
    dialect, database_url, table_name, kafka_config
) -> None:
    create_outbox_table(database_url, table_name)
    with proxied(database_url, dialect) as (proxy, url), harvesting(config(kafka_config, url, table_name)) as (_h, ops):
        proxy.blackhole()
        try:
            # Every answer comes within ANSWER_WITHIN (answer() fails otherwise), while the
            # database swallows every byte; readiness turns to 503 once a ping goes unanswered.
            # The server pings on its own timer: the first probe once a timer's ping has gone
            # unanswered for the probe's timeout knows (waited for without a probe).
            database = _h.runner._database_probe  # type: ignore[union-attr]

            def unanswered() -> bool:
                since = database._pinging_since
                return since is not None and time.monotonic() - since > database.timeout

            wait_until(unanswered, 2 * PING_INTERVAL + 30, "a timer's ping to go unanswered")
            status, body = readyz(ops)
            assert status == 503 and body["status"] == "not ready" and body["down"] == ["database"]
            assert "has not answered" in body["errors"]["database"]
            metrics_status, metrics = answer(ops.url + "/metrics")
            assert metrics_status == 200 and "pyharvest_database_connected 0.0" in metrics
            assert answer(ops.url + "/healthz")[0] == 200  # alive: a restart brings no database back
        finally:
            proxy.heal()
            proxy.reset_connections()  # what the black hole swallowed left those connections dead
        wait_until(lambda: readyz(ops)[0] == 200, 30, "/readyz to recover")


def test_a_table_dropped_mid_run_is_reported_as_at_start(  # type: ignore[no-untyped-def]
    database_url, table_name, kafka_config, caplog
) -> None:
    caplog.set_level(logging.INFO, logger="pyharvest")
    create_outbox_table(database_url, table_name)
    engine = sa.create_engine(database_url)
    try:
        with harvesting(config(kafka_config, database_url, table_name, io_error_backoff=0.05)) as (harvest, ops):
            with engine.begin() as conn:
                conn.execute(sa.text(f"DROP TABLE {table_name}"))
            wait_until(lambda: readyz(ops)[0] == 503, 30, "/readyz to report the missing table")
            _status, body = readyz(ops)
            assert body["down"] == ["database"]
            why = body["errors"]["database"]
            assert f"outbox table {table_name!r} does not exist" in why and "reaper init-db --data-source" in why
            wait_until(lambda: harvest.metrics.mark_errors >= 3, 30, "marks to fail")
            marks = [r.getMessage() for r in caplog.records if "mark failed" in r.getMessage()]
            assert marks and "does not exist" in marks[0] and "reaper init-db --data-source" in marks[0]
            # Repeats of the one cause are counted, not logged each time.
            assert len(marks) == 1, marks
            create_outbox_table(database_url, table_name)
            wait_until(lambda: readyz(ops)[0] == 200, 30, "/readyz to recover once the table is back")
            wait_until(lambda: any("marks succeed again" in r.getMessage() for r in caplog.records), 30, "recovery")
    finally:
        engine.dispose()
    repeated = [r.getMessage() for r in caplog.records if "mark failed" in r.getMessage() and "repeated" in r.getMessage()]
    assert len(repeated) == 1 and "more time" in repeated[0]


def test_a_lasting_database_failure_is_logged_once_per_cause_with_a_count(  # type: ignore[no-untyped-def]
    dialect, database_url, table_name, kafka_config, caplog
) -> None:
    caplog.set_level(logging.INFO, logger="pyharvest")
    create_outbox_table(database_url, table_name)
    with proxied(database_url, dialect) as (proxy, url), \
            harvesting(config(kafka_config, url, table_name, io_error_backoff=0.05)) as (harvest, _ops):
        before = harvest.metrics.mark_errors
        proxy.refuse(True)
        proxy.reset_connections()
        wait_until(lambda: harvest.metrics.mark_errors - before >= 10, 60, "ten failed marks")
        proxy.refuse(False)
        wait_until(lambda: any("marks succeed again" in r.getMessage() for r in caplog.records), 60, "recovery")
    lines = [r.getMessage() for r in caplog.records if r.name == "pyharvest.harvest"]
    failed = [line for line in lines if line.startswith("mark failed")]
    refreshed = [line for line in lines if line.startswith("refreshed leader id")]
    causes = {line.split(" (repeated")[0] for line in failed}
    # Each cause once as it came, once with its count when the failure ended.
    assert len(failed) <= 2 * len(causes) and any("repeated" in line for line in failed), failed
    assert len(refreshed) <= 2 and any("repeated" in line for line in refreshed), refreshed
    assert harvest.metrics.mark_errors - before >= 10
