"""The mark's key-set cursor (pyharvest.bindings.sql.mark_cursor) on a fake clock: where marks
start, and that no row a mark could not see yet is skipped for good."""

from __future__ import annotations

from pyharvest.bindings.sql.mark_cursor import MarkCursor


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def marked(c: MarkCursor, leader_id: str, after: int, limit: int, ids: list[int]) -> None:
    c.marked(leader_id, after, limit, len(ids), max(ids, default=after))


def cursor(lookback: float = 1.0) -> tuple[MarkCursor, Clock]:
    clock = Clock()
    return MarkCursor(lookback, clock), clock


def test_a_new_leader_id_marks_from_the_lowest_id():
    c, clock = cursor()
    assert c.start("a") == 0
    marked(c, "a", 0, 100, [1, 2, 3])
    clock.now += 5
    assert c.start("a") == 3
    assert c.start("b") == 0  # a remark takes every unacknowledged row again


def test_marks_start_past_what_was_marked_a_lookback_ago_not_past_the_last_mark():
    c, clock = cursor(lookback=1.0)
    c.start("a")
    marked(c, "a", 0, 100, [10, 11])
    clock.now += 0.5
    # Half a lookback later, a row below 11 may still commit (its id was handed out before):
    # the next mark starts from the lowest id again.
    assert c.start("a") == 0
    marked(c, "a", 0, 100, [12, 20])
    clock.now += 0.6
    assert c.start("a") == 11  # the first mark is a lookback old, the second not yet
    clock.now += 1.0
    assert c.start("a") == 20


def test_an_empty_mark_leaves_the_cursor_where_it_was():
    c, clock = cursor()
    c.start("a")
    marked(c, "a", 0, 100, [5])
    clock.now += 2
    assert c.start("a") == 5
    marked(c, "a", 5, 100, [])
    clock.now += 2
    assert c.start("a") == 5


def test_a_reset_rewinds_the_cursor_until_a_mark_has_walked_up_from_it():
    c, clock = cursor()
    c.start("a")
    marked(c, "a", 0, 100, list(range(1, 51)))
    clock.now += 2
    assert c.start("a") == 50
    c.rewind("a", 9)  # rows 10.. reset under "a"
    assert c.start("a") == 9
    # The mark from 9 stopped at its limit below the floor: the rest of the reset rows lie above.
    marked(c, "a", 9, 5, [10, 11, 12, 13, 14])
    assert c.start("a") == 14
    marked(c, "a", 14, 5, [15, 16])  # fewer than its limit: nothing unmarked is left above 14
    assert c.start("a") == 50


def test_a_rewind_for_another_leader_id_is_ignored_and_none_means_whatever_leads():
    c, clock = cursor()
    c.start("a")
    marked(c, "a", 0, 100, [1, 2, 3])
    clock.now += 2
    c.rewind("old", 0)
    assert c.start("a") == 3
    c.rewind(None, 1)
    assert c.start("a") == 1


def test_a_mark_under_a_replaced_leader_id_does_not_move_the_cursor():
    c, clock = cursor()
    c.start("a")
    c.start("b")
    marked(c, "a", 0, 100, [7, 8])  # a mark under "a" that returned after "b" took over
    clock.now += 2
    assert c.start("b") == 0


def test_the_position_is_what_the_late_row_scan_looks_below():
    c, clock = cursor()
    assert c.position() == (None, 0)
    c.start("a")
    marked(c, "a", 0, 100, [3, 4])
    clock.now += 2
    c.start("a")
    assert c.position() == ("a", 4)
