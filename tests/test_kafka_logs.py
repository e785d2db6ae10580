"""librdkafka's repeated log lines collapse into one line per cause, with a count."""

from __future__ import annotations

import logging

import pytest

from pyharvest.bindings.kafka.librdkafka_logs import CollapsingLogger, cause_of

REFUSED = (
    "FAIL [rdkafka#{client}] [thrd:127.0.0.1:9/bootstrap]: 127.0.0.1:9/bootstrap: Connect to ipv4#127.0.0.1:9 "
    "failed: Connection refused (after {ms}ms in state CONNECT{suppressed})"
)


def refused(client: str = "consumer-1", ms: int = 0, suppressed: int = 0) -> str:
    return REFUSED.format(client=client, ms=ms, suppressed=f", {suppressed} identical error(s) suppressed" * bool(suppressed))


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def collapsing(caplog):
    caplog.set_level(logging.DEBUG, logger="test.librdkafka")
    clock = Clock()
    return CollapsingLogger(logging.getLogger("test.librdkafka"), interval=30.0, clock=clock, cause=cause_of), clock, caplog


def lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records]


def test_repeats_of_one_cause_are_one_line_then_a_count(collapsing):
    logger, clock, caplog = collapsing
    for i in range(500):
        clock.now += 0.05
        logger.log(logging.ERROR, "%s [%s] %s", "FAIL", "rdkafka#consumer-1", refused(ms=i % 3)[len("FAIL [rdkafka#consumer-1] "):])
    assert len(lines(caplog)) == 1
    logger.flush()
    first, summary = lines(caplog)
    assert "Connection refused" in first
    assert summary.endswith("(repeated 499 more times)")
    logger.flush()
    assert len(lines(caplog)) == 2  # nothing new to report


def test_a_cause_that_goes_on_is_reported_once_per_interval(collapsing):
    logger, clock, caplog = collapsing
    for _ in range(121):  # one a second for two minutes
        logger.log(logging.ERROR, refused())
        clock.now += 1.0
    reported = lines(caplog)
    assert len(reported) == 1 + 4
    assert all(line.endswith("(repeated 30 more times)") for line in reported[1:])


def test_distinct_causes_and_levels_are_reported_separately(collapsing):
    logger, _clock, caplog = collapsing
    for _ in range(3):
        logger.log(logging.ERROR, refused())
        logger.log(logging.ERROR, "ERROR [rdkafka#consumer-1] [thrd:app]: 1/1 brokers are down")
        logger.log(logging.WARNING, "ERROR [rdkafka#consumer-1] [thrd:app]: 1/1 brokers are down")
    assert len(lines(caplog)) == 3
    logger.flush()
    assert [r.levelno for r in caplog.records[3:]] == [logging.ERROR, logging.ERROR, logging.WARNING]


def test_the_client_and_librdkafka_own_notes_do_not_make_a_new_cause():
    assert cause_of(refused("consumer-1")) == cause_of(refused("producer-7", ms=30021, suppressed=4))
    assert cause_of(refused()) != cause_of(refused().replace("127.0.0.1:9", "127.0.0.1:10"))
    assert cause_of(refused()).endswith("Connection refused")


def test_the_causes_remembered_are_bounded(collapsing):
    from pyharvest.bindings.kafka.librdkafka_logs import MAX_CAUSES

    logger, clock, caplog = collapsing
    for i in range(MAX_CAUSES * 3):
        logger.log(logging.WARNING, f"cause {i}")
        clock.now += 1.0
    assert len(logger._causes) <= MAX_CAUSES
    assert len(lines(caplog)) == MAX_CAUSES * 3  # each logged once, as it came


def test_the_fence_s_expected_retry_is_info_and_other_warnings_stay_warnings(caplog):
    from pyharvest.bindings.kafka.librdkafka_logs import librdkafka_logger

    caplog.set_level(logging.DEBUG, logger="pyharvest.librdkafka")
    logger = librdkafka_logger()
    getpid = ("GETPID [rdkafka#producer-7] [thrd:main]: Failed to acquire transactional PID from broker "
              "TxnCoordinator/1: Broker: Producer attempted to update a transaction while another concurrent "
              "operation on the same transaction was ongoing: retrying")
    logger.log(logging.WARNING, getpid)
    logger.log(logging.WARNING, refused("producer-9"))
    levels = {r.getMessage()[:6]: r.levelno for r in caplog.records if r.name == "pyharvest.librdkafka"}
    assert levels["GETPID"] == logging.INFO and levels["FAIL ["] == logging.WARNING
