"""Two of the metrics, on fakes: the publish latency (every record counted in its bucket, at
each acknowledgement or, exactly once, each commit) and the outbox's oldest row's age (left out
while it cannot be read)."""

from __future__ import annotations

import pytest

pytest.importorskip("prometheus_client")

from pyharvest.bindings.ops import start_ops_server  # noqa: E402
from tests.helpers.engine import fill, make  # noqa: E402
from tests.helpers.fakes import FakeBinding, FakeKafka  # noqa: E402
from tests.helpers.ops import LOCAL, scrape  # noqa: E402
from tests.helpers.waiting import wait_until  # noqa: E402


def test_exactly_once_observes_the_publish_latency_at_each_commit():
    from tests.helpers.engine import make_exactly_once as exactly_once
    from tests.helpers.fakes import FakeTransactionalKafka

    db, kafka = FakeBinding(), FakeTransactionalKafka()
    fill(db, 120, 12)
    h = exactly_once(db, kafka)
    ops = start_ops_server(h, LOCAL)
    try:
        with h:
            wait_until(lambda: len(db) == 0, 20)
            wait_until(lambda: scrape(ops).get("pyharvest_publish_latency_seconds_count") == 120, 10)
        m = scrape(ops)
        assert m["pyharvest_transactions_committed_total"] >= 1
        assert m["pyharvest_transaction_duration_seconds_count"] == m["pyharvest_transactions_committed_total"]
    finally:
        ops.stop()


def test_an_age_reading_that_fails_leaves_the_gauge_out_until_one_works(caplog):
    class Flaky(FakeBinding):
        failing = True

        def oldest_create_time(self):
            if Flaky.failing:
                raise ConnectionError("the database went away")
            return None

    h = make(Flaky(), FakeKafka())
    ops = start_ops_server(h, {**LOCAL, "ageInterval": "20ms"})
    try:
        with h:
            wait_until(lambda: "reading the outbox's oldest_create_time failed" in caplog.text, 5)
            assert "pyharvest_oldest_record_age_seconds" not in scrape(ops)
            Flaky.failing = False
            wait_until(lambda: scrape(ops).get("pyharvest_oldest_record_age_seconds") == 0, 5)  # empty: 0
    finally:
        ops.stop()


def test_publish_latency_counts_every_record_in_its_bucket():
    from datetime import UTC, datetime, timedelta

    from pyharvest.core.outbox.records import OutboxRecord
    from pyharvest.core.telemetry.latency import PublishLatency

    now = datetime.now(UTC)
    ages = [0.001, 0.2, 3.0, 45.0, 7200.0]
    records = [OutboxRecord("t", "k", b"v", (), i, now - timedelta(seconds=a)) for i, a in enumerate(ages)]
    records.append(OutboxRecord("t", "k", b"v", (), 9, (now - timedelta(seconds=2.0)).replace(tzinfo=None)))  # naive: UTC
    records.append(OutboxRecord("t", "k", b"v", (), 10, now + timedelta(seconds=5)))  # the writer's clock ahead
    records.append(OutboxRecord("t", "k", b"v"))  # no create_time: not counted
    latency = PublishLatency()
    latency.observe(records)
    counts, total = latency.snapshot()
    assert latency.total == sum(counts) == 7
    by_bound = dict(zip([*latency.bounds, float("inf")], counts, strict=True))
    assert by_bound[0.005] == 2  # 1 ms, and 0 for the clock ahead
    assert by_bound[0.25] == 1 and by_bound[2.5] == 1 and by_bound[5.0] == 1 and by_bound[60.0] == 1
    assert by_bound[float("inf")] == 1  # two hours
    assert 7200 < total < 7300
