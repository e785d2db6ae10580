"""The one way tests wait: on a condition, with a deadline that says what did not happen.

A test that sleeps and then asserts is as slow as its longest sleep and still flaky on a busy
machine; waiting on the condition is as fast as the system and as patient as the deadline.
Deadlines are generous (a loaded 2-core machine runs the suite): they bound a failing test's
time, not a passing one's. To assert that something did not happen, wait first for a later
event that proves the code had its chance (a later record, a mark, a heartbeat), then assert.
The few fixed sleeps left in tests/ say why no condition can be waited on (``# fixed sleep:``);
``tests/test_test_hygiene.py`` counts them.
"""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["wait_until"]


def wait_until(cond: Callable[[], object], timeout: float = 60.0, what: str | Callable[[], str] = "the condition",
               interval: float = 0.01) -> None:
    """Return as soon as ``cond()`` is true; fail naming ``what`` once ``timeout`` seconds pass
    (a callable ``what`` is asked then, to say what the last check saw)."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what() if callable(what) else what}")
        time.sleep(interval)
