"""Fresh readiness: the operations server pings the database on its own timer, so a probe that
comes after a quiet spell does not read a stale answer, and the engine's own
``TableNotFoundError`` makes the process not ready at once.

The first probe that comes more than two ping intervals after the table went away answers 503:
one interval until the timer's next ping, which then fails (or, for a database that does not
answer, another interval until the ping counts as unanswered).
"""

from __future__ import annotations

import threading
import time

import pytest
import sqlalchemy as sa

pytest.importorskip("prometheus_client")

from pyharvest.bindings.ops import OpsServer, start_ops_server  # noqa: E402
from pyharvest.bindings.sql import create_binding, create_outbox_table  # noqa: E402
from pyharvest.core.errors import TableNotFoundError  # noqa: E402
from pyharvest.core.telemetry.health import PING_INTERVAL, DatabaseProbe  # noqa: E402
from tests.helpers.engine import make  # noqa: E402
from tests.helpers.fakes import FakeBinding, FakeKafka  # noqa: E402
from tests.helpers.ops import LOCAL, probe  # noqa: E402
from tests.helpers.waiting import wait_until  # noqa: E402


def readyz(ops: OpsServer) -> tuple[int, dict]:
    return probe(ops, "/readyz")


class CountingPings:
    """A binding's ``ping`` that counts its calls."""

    def __init__(self) -> None:
        self.calls = 0

    def ping(self) -> None:
        self.calls += 1


def test_the_server_pings_on_its_own_timer_without_any_probe():
    class Pinged(FakeBinding):
        pings = 0

        def ping(self) -> None:
            Pinged.pings += 1

    h = make(Pinged(), FakeKafka())
    ops = start_ops_server(h, LOCAL)
    try:
        with h:
            # Nobody probes; the pings come anyway, one per interval.
            wait_until(lambda: Pinged.pings >= 2, 4 * PING_INTERVAL)
    finally:
        ops.stop()
    # The timer stops with the server: its thread has ended, and once the last ping it started
    # is done nothing pings any more.
    assert not ops._pinger.is_alive()
    wait_until(lambda: not any(t.name == "pyharvest-db-ping" for t in threading.enumerate()), 5, "the last ping")
    stopped_at = Pinged.pings
    assert not ops._pinger.is_alive() and Pinged.pings == stopped_at


def test_a_missing_table_met_by_the_mark_makes_the_process_not_ready_at_once():
    gone = threading.Event()
    release = threading.Event()

    class Dropped(FakeBinding):
        def mark(self, leader_id, limit):
            if gone.is_set():
                raise TableNotFoundError("outbox", "sqlite:///x.db", "`reaper init-db -f reaper.yaml`")
            return super().mark(leader_id, limit)

        def ping(self) -> None:
            if gone.is_set():
                release.wait(30)  # a ping that would take long to tell: readiness must not wait for it

    h = make(Dropped(), FakeKafka())
    ops = start_ops_server(h, LOCAL)
    try:
        with h:
            wait_until(lambda: h.is_leader and readyz(ops)[0] == 200, 10)
            gone.set()
            started = time.monotonic()
            wait_until(lambda: readyz(ops)[0] == 503, 10, "readiness to report the missing table")
            took = time.monotonic() - started
            _, body = readyz(ops)
            assert body["down"] == ["database"] and "does not exist" in body["errors"]["database"], body
            assert "reaper init-db" in body["errors"]["database"]
            print(f"not ready {took:.2f}s after the table went (the ping still running)")
            release.set()
    finally:
        release.set()
        ops.stop()


def test_probe_state_follows_the_noted_failure_until_a_ping_answers():
    probe = DatabaseProbe(interval=0.01, timeout=5)
    binding = CountingPings()
    wait_until(lambda: probe.state(binding) == (True, None), 5)  # type: ignore[arg-type]
    probe.note_failure(ConnectionError("a passing error"))  # not a missing table: ignored
    assert probe.state(binding)[0] is True  # type: ignore[arg-type]
    probe.note_failure(TableNotFoundError("outbox", "db", "`reaper init-db`"))
    answer, why = probe.state(binding)  # type: ignore[arg-type]
    assert answer is False and "does not exist" in (why or "")
    wait_until(lambda: probe.state(binding) == (True, None), 5)  # type: ignore[arg-type]


def test_a_standby_reports_a_dropped_table_on_the_first_probe_two_intervals_later(tmp_path):
    # A standby does not mark: only the timer's ping can tell. No probe comes meanwhile.
    url = f"sqlite:///{tmp_path / 'outbox.db'}"
    create_outbox_table(url)
    kafka = FakeKafka()
    leader = make(FakeBinding(), kafka)
    with leader:
        wait_until(lambda: leader.is_leader, 5)
        standby = make(create_binding(url), kafka)  # type: ignore[arg-type]
        ops = start_ops_server(standby, LOCAL)
        try:
            with standby:
                wait_until(lambda: readyz(ops)[0] == 200, 10, "the standby to be ready")
                assert readyz(ops)[1]["role"] == "standby"
                engine = sa.create_engine(url)
                with engine.begin() as conn:
                    conn.execute(sa.text("DROP TABLE outbox"))
                engine.dispose()
                # The server's timer pings on its own: its answer since the drop is the one the
                # first probe reads (read here without a probe, which could start a ping itself).
                database = standby._database_probe
                wait_until(lambda: database._answer is False, 2 * PING_INTERVAL + 30, "a timer's ping to fail")
                status, body = readyz(ops)  # the first probe since the drop
                assert status == 503, body
                assert body["down"] == ["database"] and "does not exist" in body["errors"]["database"], body
        finally:
            ops.stop()
