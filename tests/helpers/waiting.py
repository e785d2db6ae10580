"""The one way tests wait: on a condition, with a deadline that says what did not happen.

A test that sleeps and then asserts is as slow as its longest sleep and still flaky on a busy
machine; waiting on the condition is as fast as the system and as patient as the deadline.
Deadlines are generous (a loaded 2-core machine runs the suite): they bound a failing test's
time, not a passing one's.
"""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["wait_until"]


def wait_until(cond: Callable[[], object], timeout: float = 60.0, what: str = "the condition",
               interval: float = 0.01) -> None:
    """Return as soon as ``cond()`` is true; fail naming ``what`` once ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out after {timeout:g}s waiting for {what}"
        time.sleep(interval)
