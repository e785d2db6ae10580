"""The engine's logger and how an error is written into a log line.

Every part of the engine logs under ``pyharvest.harvest``, the name operators already filter
on; splitting the engine into modules must not split its log.

With ``shards: N`` a process runs an engine per shard it leads, all logging the same lines;
each engine's threads carry their shard (:func:`label_thread`), and every line they log
starts with it (``[shard 3] mark failed…``), whichever module of the engine logs it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["label_thread", "labelled", "log", "one_line"]

log = logging.getLogger("pyharvest.harvest")

_thread = threading.local()


def label_thread(label: str | None) -> None:
    """Start every engine line this thread logs with ``[label]`` (``None``: no label)."""
    _thread.label = label


@contextmanager
def labelled(label: str | None) -> Iterator[None]:
    """:func:`label_thread` for a block: a callback one engine's owner runs on its own thread."""
    previous = getattr(_thread, "label", None)
    _thread.label = label
    try:
        yield
    finally:
        _thread.label = previous


class _ThreadLabel(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        label = getattr(_thread, "label", None)
        if label is not None:
            record.msg = f"[{label}] {record.msg}"
        return True


log.addFilter(_ThreadLabel())


def one_line(e: BaseException) -> str:
    """``Type: first line``; driver errors run to many lines of SQL and parameters."""
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"
