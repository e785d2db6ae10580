"""The engine's logger and how an error is written into a log line.

Every part of the engine logs under ``pyharvest.harvest``, the name operators already filter
on; splitting the engine into modules must not split its log.
"""

from __future__ import annotations

import logging

__all__ = ["log", "one_line"]

log = logging.getLogger("pyharvest.harvest")


def one_line(e: BaseException) -> str:
    """``Type: first line``; driver errors run to many lines of SQL and parameters."""
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"
