"""The exactly-once window's state: each event a transition of one enum, and what each state
lets the main loop and the publisher's thread do."""

from __future__ import annotations

import itertools
import threading

from pyharvest.core.outbox.records import OutboxRecord
from pyharvest.core.publishing.transaction_window import Publish, Purge, TakeOver, TransactionWindow, WindowState
from tests.helpers.waiting import wait_until

S = WindowState


_ids = itertools.count(1)


def records(*keys: str, ids: list[int] | None = None) -> list[OutboxRecord]:
    """Records with ids never used before (as the outbox's), unless ``ids`` names them."""
    ids = ids or [next(_ids) for _ in keys]
    return [OutboxRecord("t", key=k, value=b"v", id=i) for i, k in zip(ids, keys, strict=True)]


def test_a_term_takes_over_before_anything_is_marked_or_published():
    w, done = TransactionWindow(10), threading.Event()
    assert w.state is S.STANDBY and not w.may_mark(0)
    w.begin_term()
    w.lead()
    assert w.state is S.TAKING_OVER and not w.may_mark(0)
    w.dispatch(records("a"))
    assert w.in_flight == 1  # held: the takeover comes first
    assert w.next_job(done) == TakeOver()
    w.fenced()
    w.taken_over()
    assert w.state is S.PUBLISHING and w.may_mark(0)
    w.dispatch(records("b"))
    job = w.next_job(done)
    assert isinstance(job, Publish) and [r.key for r in job.batch] == ["a", "b"] and w.in_flight == 2
    ids = [r.id for r in job.batch]
    w.ended(ids)
    assert w.unpurged == ids and w.in_flight == 2
    assert w.next_job(done) == Purge()  # nothing queued to overlap it with
    w.purged(True)
    assert w.in_flight == 0
    done.set()
    assert w.next_job(done) is None


def test_an_abort_stops_publishing_until_the_remark():
    w = TransactionWindow(10)
    w.lead()
    w.taken_over()
    w.dispatch(records("a"))
    w.raise_remark()
    assert w.state is S.REMARKING and w.force_remark and w.in_flight == 0
    w.dispatch(records("b"))
    assert w.in_flight == 0
    w.quiesce("remark", None, lambda: True)
    assert w.state is S.PAUSED and not w.force_remark
    w.lead()
    assert w.state is S.PUBLISHING


def test_a_producer_in_doubt_remarks_and_takes_over_afresh():
    w, done = TransactionWindow(10), threading.Event()
    w.lead()
    w.taken_over()
    w.in_doubt()
    assert w.state is S.RECOVERING and w.force_remark
    assert w.next_job(done) == TakeOver()  # while the main loop remarks
    w.taken_over()
    assert w.state is S.REMARKING
    w.quiesce("remark", None, lambda: True)
    w.lead()
    assert w.state is S.PUBLISHING


def test_a_purge_that_fails_makes_the_next_commit_wait_for_a_takeover():
    w = TransactionWindow(10)
    w.lead()
    w.taken_over()
    w.ended([7])
    w.purged(False)
    assert w.state is S.TAKING_OVER and w.unpurged == [] and not w.may_mark(0)


def test_losing_leadership_makes_the_next_term_take_over_again():
    w = TransactionWindow(10)
    w.lead()
    w.taken_over()
    w.stop_leading()
    assert w.state is S.PAUSED and not w.state.leading
    w.begin_term()
    w.lead()
    assert w.state is S.TAKING_OVER


def test_held_keys_stay_out_of_transactions_until_their_retry_raises_a_remark():
    w, done = TransactionWindow(10), threading.Event()
    w.lead()
    w.taken_over()
    w.park({"bad"}, retry_at=0.0)
    w.dispatch(records("bad", "good"))
    job = w.next_job(done)
    assert isinstance(job, Publish) and [r.key for r in job.batch] == ["good"]
    w.ended(None)
    waiting = threading.Thread(target=w.next_job, args=(done,))  # the retry is due: it raises a remark
    waiting.start()
    wait_until(lambda: w.state is S.REMARKING, 5, "the held keys' retry")
    done.set()
    waiting.join(5)
    assert not waiting.is_alive()


def published(w: TransactionWindow, done: threading.Event) -> list[int]:
    job = w.next_job(done)
    assert isinstance(job, Publish)
    return [r.id for r in job.batch]


def test_a_record_this_leader_holds_is_not_queued_again_when_another_process_marks_its_row():
    """A deposed leader that has not noticed yet marks rows under its own id, and this
    leader's next mark takes them back: queued, running, committed or purged during that
    mark, none goes out twice."""
    w, done = TransactionWindow(100), threading.Event()
    w.lead()
    w.taken_over()
    w.begin_mark()
    first = records("a", "b")
    w.dispatch(first)
    w.dispatch(records("a", "b", ids=[r.id for r in first]))  # queued already
    running = published(w, done)
    assert running == [r.id for r in first]
    w.dispatch(records("a", "b", ids=running))  # in the running transaction
    w.ended(running)
    w.dispatch(records("a", "b", ids=running))  # committed, not yet purged
    w.begin_mark()  # a mark that reads the rows before the purge deletes them ...
    assert w.next_job(done) == Purge()
    w.purged(True)
    w.dispatch(records("a", "b", ids=running))  # ... and dispatches after it
    assert w.in_flight == 0
    w.begin_mark()  # the next mark: the purged rows are gone, new ones go out
    w.dispatch(records("c"))
    assert len(published(w, done)) == 1
