"""Adaptive polling: the pause between empty marks, its reset, and wake-ups from a change feed."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

from pyharvest import Config, Limits
from pyharvest.core.engine.harvest import HarvestEngine
from pyharvest.core.engine.idle import IdleBackoff, Wakeup
from pyharvest.core.errors import ConfigError
from pyharvest.core.ports.database import ChangeFeed
from tests.helpers.fakes import FakeBinding, FakeKafka
from tests.helpers.waiting import wait_until


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def empty_marks(idle: IdleBackoff, clock: Clock, n: int) -> list[float]:
    """The pauses after ``n`` empty marks, each made when the one before was due."""
    pauses = []
    for _ in range(n):
        idle.found_nothing()
        pauses.append(round(idle.due_in(), 6))
        clock.now += idle.due_in()
    return pauses


def test_pause_doubles_from_mark_backoff_up_to_the_bound_once_idle():
    clock = Clock()
    idle = IdleBackoff(0.01, 1.0, clock, idle_after=0.1)
    assert idle.due_in() <= 0  # the first mark is due at once
    pauses = empty_marks(idle, clock, 22)
    # A quarter, then half of markBackoff after rows; markBackoff until 100 ms of emptiness,
    # then doubling to the bound.
    assert pauses == [0.0025, 0.005] + [0.01] * 10 + [0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.0, 1.0, 1.0, 1.0]


def test_short_gaps_in_a_busy_stream_keep_the_pause_short():
    clock = Clock()
    idle = IdleBackoff(0.01, 1.0, clock, idle_after=0.1)
    for _ in range(50):  # a burst of rows every 30 ms: three or four empty marks between
        idle.found_rows()
        assert empty_marks(idle, clock, 4) == [0.0025, 0.005, 0.01, 0.01]


def test_the_first_empty_marks_after_rows_pause_less():
    """Under a steady stream the pause after an empty mark is most of a record's wait: it
    starts at a quarter of markBackoff after rows, and grows to markBackoff."""
    clock = Clock()
    idle = IdleBackoff(0.008, 1.0, clock, idle_after=0.1)
    idle.found_rows()
    assert empty_marks(idle, clock, 3) == [0.002, 0.004, 0.008]
    idle.found_rows()
    assert empty_marks(idle, clock, 1) == [0.002]  # after rows, the ramp starts again
    zero = IdleBackoff(0.0, 1.0, clock)
    assert set(empty_marks(zero, clock, 5)) == {0.0}  # markBackoff 0: marks back to back


def test_rows_reset_the_pause():
    clock = Clock()
    idle = IdleBackoff(0.01, 1.0, clock, idle_after=0.1)
    empty_marks(idle, clock, 30)
    assert idle.pause == 1.0
    idle.found_rows()
    assert idle.due_in() <= 0  # the next mark follows at once
    idle.found_nothing()
    assert idle.due_in() == pytest.approx(0.0025)


def test_a_wake_up_makes_the_mark_due_now_and_ramps_again_if_it_finds_nothing():
    clock = Clock()
    idle = IdleBackoff(0.01, 1.0, clock, idle_after=0.1)
    assert empty_marks(idle, clock, 16)[-1] == 0.16
    idle.wake()
    assert idle.due_in() <= 0
    # A wake-up datagram may come just before its rows are visible: the mark finds nothing,
    # and the next ones follow within milliseconds, as after rows.
    assert empty_marks(idle, clock, 4) == [0.0025, 0.005, 0.01, 0.01]
    # Then, nothing coming, the pause grows back to its bound as it does after rows.
    assert empty_marks(idle, clock, 30)[-1] == 1.0


def test_a_bound_below_mark_backoff_means_a_constant_pause():
    clock = Clock()
    idle = IdleBackoff(0.05, 0.01, clock)
    assert empty_marks(idle, clock, 10)[2:] == [0.05] * 8  # after the ramp


def test_wakeup_kept_until_waited_for():
    w = Wakeup()
    assert not w.wait(0)
    w.set()
    assert w.wait(0)  # a wake-up that came before the wait ends it at once
    assert not w.wait(0.01)  # and is consumed
    threading.Timer(0.02, w.set).start()
    started = time.monotonic()
    assert w.wait(5)
    assert time.monotonic() - started < 4


def test_limits_default_and_validation():
    lim = Limits().resolve()
    assert lim.max_mark_backoff == 1.0
    assert Limits(mark_backoff=2.0).resolve().max_mark_backoff == 2.0  # never below markBackoff
    assert Limits.from_mapping({"maxMarkBackoff": "250ms"}).resolve().max_mark_backoff == 0.25
    assert Limits(max_mark_backoff=0.5).resolve().to_mapping()["maxMarkBackoff"] == "500ms"
    with pytest.raises(ConfigError, match=r"limits\.maxMarkBackoff.*at least 100ms"):
        Limits(mark_backoff=0.1, max_mark_backoff=0.05).resolve()


# ----------------------------------------------------------------------------- the engine


class FeedBinding(FakeBinding):
    """A fake outbox that announces inserts, like PostgreSQL's NOTIFY, when ``notify`` is on."""

    def __init__(self, notify: bool = True) -> None:
        super().__init__()
        self.notify = notify
        self._wake: Callable[[], None] | None = None

    def watch(self, wake: Callable[[], None]) -> Callable[[], None] | None:
        self._wake = wake
        return self._unwatch

    def _unwatch(self) -> None:
        self._wake = None

    @property
    def feed_connected(self) -> bool | None:
        return self._wake is not None

    def insert(self, *args, **kwargs) -> int:  # type: ignore[no-untyped-def]
        rid = super().insert(*args, **kwargs)
        if self.notify and self._wake is not None:
            self._wake()
        return rid


def engine(binding: FakeBinding, kafka: FakeKafka, **limits: float) -> HarvestEngine:
    lim = Limits(min_poll_interval=0.005, heartbeat_timeout=0.5, io_error_backoff=0.01, shutdown_timeout=2.0,
                 **limits)  # type: ignore[arg-type]
    cfg = Config(leader_topic="app.neli", leader_group_id="app", data_source="fake://", limits=lim)
    return HarvestEngine(cfg, binding=binding, kafka=kafka)


def test_an_idle_leader_backs_off_and_records_still_flow():
    db, kafka = FakeBinding(), FakeKafka()
    with engine(db, kafka, mark_backoff=0.01, max_mark_backoff=0.2) as h:
        wait_until(lambda: h.is_leader)
        wait_until(lambda: h._idle.pause >= 0.2, 10, "the pause to grow to maxMarkBackoff")
        marks, since = db.marks, time.monotonic()
        wait_until(lambda: db.marks >= marks + 3, 10, "three more empty marks")
        # Backed off to 0.2 s: two whole pauses at least between the three marks, where a
        # constant 10 ms makes them 20 ms apart.
        assert time.monotonic() - since >= 0.35
        db.insert("data", "k", b"1")
        wait_until(lambda: len(db) == 0)
        assert kafka.cluster.logs["data"] == [("k", b"1")]
        assert h.health().change_feed_connected is None  # polled: no feed


def test_a_notification_wakes_an_idle_leader_long_before_its_pause_ends():
    db, kafka = FeedBinding(), FakeKafka()
    with engine(db, kafka, mark_backoff=0.01, max_mark_backoff=30.0) as h:
        wait_until(lambda: h.is_leader)
        assert isinstance(db, ChangeFeed)
        assert h.health().change_feed_connected is True
        for i in range(3):
            wait_until(lambda: h._idle.pause >= 1.0, 10, "the pause to grow past a second")
            started = time.monotonic()
            db.insert("data", "k", str(i).encode())
            wait_until(lambda: len(db) == 0, timeout=20)
            # Published on the notification, not after a pause of up to 30 s.
            assert time.monotonic() - started < 10
        assert [v for _, v in kafka.cluster.logs["data"]] == [b"0", b"1", b"2"]
    assert db.feed_connected is False  # the engine stopped watching when it stopped


def test_without_a_notification_polling_finds_the_record_within_the_bound():
    db, kafka = FeedBinding(notify=False), FakeKafka()
    with engine(db, kafka, mark_backoff=0.01, max_mark_backoff=0.3) as h:
        wait_until(lambda: h.is_leader)
        wait_until(lambda: h._idle.pause >= 0.3, 10, "the pause to grow to maxMarkBackoff")
        db.insert("data", "k", b"lost notification")
        wait_until(lambda: len(db) == 0, timeout=20)
        assert kafka.cluster.logs["data"] == [("k", b"lost notification")]
