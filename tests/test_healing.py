"""The heal's policy (pyharvest.core.healing.stuck_clients), on a fake clock: a client is replaced only after
no progress for three group session timeouts, and only while a fresh client fares better."""

from __future__ import annotations

import logging
import threading

from pyharvest.core.healing.stuck_clients import HEAL_AFTER_SESSIONS, ProbeAnswer, ProgressWatch, heal_after
from pyharvest.core.telemetry.client_restarts import restarts
from tests.helpers.waiting import wait_until


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Probe:
    """Answers as told; counts its calls; can be held to show that stuck() never waits on it."""

    def __init__(self, answers: bool = True) -> None:
        self.answers = answers
        self.calls = 0
        self.release = threading.Event()
        self.release.set()
        self.done = threading.Event()

    def __call__(self, timeout: float) -> ProbeAnswer:
        self.calls += 1
        self.release.wait(10)
        self.done.set()
        return ProbeAnswer(self.answers, "told so")


def settle(watch: ProgressWatch, probe: Probe) -> bool:
    """stuck(), then again once the probe it started has answered."""
    probe.done.clear()
    calls = probe.calls
    if watch.stuck():
        return True
    if probe.calls > calls or watch._probing:
        wait_until(probe.done.is_set, 5, "the probe")
        wait_until(lambda: not watch._probing, 5, "the probe's verdict")
    return watch.stuck()


def test_three_sessions_of_the_leader_group():
    # heartbeatTimeout 2 s: a session of 6 s; 5 s (the default): 15 s
    assert heal_after(2.0) == HEAL_AFTER_SESSIONS * 6.0 == 18.0
    assert heal_after(5.0) == 45.0
    # a broker that set a longer session (the consumer protocol's bounds) counts that one
    assert heal_after(2.0, session_seconds=45.0) == 135.0


def test_no_probe_and_no_verdict_before_the_limit():
    clock, probe = Clock(), Probe()
    watch = ProgressWatch("producer", 18.0, probe, clock=clock)
    clock.now += 17.9
    assert not settle(watch, probe)
    assert probe.calls == 0


def test_stuck_once_a_fresh_client_gets_answers(caplog):
    clock, probe = Clock(), Probe()
    watch = ProgressWatch("leader_consumer", 18.0, probe, clock=clock)
    clock.now += 18.5
    assert settle(watch, probe)
    before = restarts.snapshot().get("leader_consumer", 0)
    with caplog.at_level(logging.WARNING, logger="pyharvest"):
        watch.replaced("2 partition(s) revoked")
    assert restarts.snapshot()["leader_consumer"] == before + 1
    line = next(r.getMessage() for r in caplog.records if "replaced the stuck Kafka" in r.getMessage())
    assert "leader consumer" in line and "3 group session timeouts" in line and "told so" in line, line
    # the clock starts again: not stuck until another limit has passed
    assert not watch.stuck()
    clock.now += 10
    assert not settle(watch, probe)


def test_kept_while_a_fresh_client_fares_no_better(caplog):
    clock, probe = Clock(), Probe(answers=False)
    watch = ProgressWatch("producer", 18.0, probe, clock=clock)
    clock.now += 30
    with caplog.at_level(logging.INFO, logger="pyharvest"):
        assert not settle(watch, probe)
        # logged by the probe's thread once its verdict is in
        wait_until(lambda: any("fares no better" in r.getMessage() for r in caplog.records), 5, "the log line")
    # probed again at most every limit / 3, and replaced as soon as the cluster answers
    assert not watch.stuck() and probe.calls == 1
    clock.now += 6.1
    probe.answers = True
    assert settle(watch, probe)
    assert probe.calls == 2


def test_progress_meanwhile_voids_the_verdict():
    clock, probe = Clock(), Probe()
    watch = ProgressWatch("producer", 18.0, probe, clock=clock)
    clock.now += 20
    probe.release.clear()
    assert not watch.stuck()  # starts the probe, which is held: stuck() did not wait on it
    watch.progressed()  # the client recovered by itself while the probe ran
    probe.release.set()
    wait_until(lambda: not watch._probing, 5, "the probe")
    assert not watch.stuck()


def test_a_probe_that_raises_counts_as_no_answer(caplog):
    clock = Clock()
    probed = threading.Event()

    def probe(timeout: float) -> ProbeAnswer:
        probed.set()
        raise OSError("unreachable, says test_a_probe_that_raises")

    watch = ProgressWatch("producer", 18.0, probe, clock=clock)
    clock.now += 20
    with caplog.at_level(logging.INFO, logger="pyharvest"):
        assert not watch.stuck()
        wait_until(probed.is_set, 5, "the probe")
        # the client is kept, and the line says what the probe met
        wait_until(lambda: any("fares no better (OSError: unreachable, says test_a_probe_that_raises)"
                               in r.getMessage() for r in caplog.records), 5, "the log line")
    assert not watch.stuck()


def test_progress_starts_the_clock_again():
    clock, probe = Clock(), Probe()
    watch = ProgressWatch("producer", 18.0, probe, clock=clock)
    clock.now += 10
    watch.progressed()
    clock.now += 17.9  # 27.9 s since the watch began, 17.9 s since the progress
    assert not settle(watch, probe)
    assert probe.calls == 0
    clock.now += 0.6
    assert settle(watch, probe)
