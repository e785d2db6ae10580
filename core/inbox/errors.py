"""The inbox's base error, and how its errors are told in one line."""

from __future__ import annotations

from pyharvest.core.errors import HarvestError

__all__ = ["InboxError", "first_line"]


class InboxError(HarvestError):
    """The inbox could not run: no database, no broker, a fatal consumer error."""


def first_line(error: BaseException) -> str:
    """The first line of an exception's text: SQLAlchemy appends the statement and its
    parameters on later lines, and parameters may hold data that must not reach logs."""
    lines = str(error).strip().splitlines()
    return lines[0][:500] if lines else ""
