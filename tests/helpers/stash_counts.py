"""Counting what a stash does to a record: checks, limit checks, encodings, plans made."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest


class CountedText(str):
    """Text that counts its encodings: a stash must encode a non-ASCII value once."""

    encodings = 0

    def encode(self, *args: Any, **kwargs: Any) -> bytes:  # type: ignore[override]
        CountedText.encodings += 1
        return super().encode(*args, **kwargs)


def counting(monkeypatch: pytest.MonkeyPatch, calls: dict[str, int]) -> None:
    """Count each record's checks (check_record, whose size the limits take), limit checks
    and plans made, wherever the stasher calls them."""
    from pyharvest.stasher import plans, stashers
    from pyharvest.stasher.limits import StashLimits

    def counted(name: str, real: Callable[..., Any]) -> Callable[..., Any]:
        def count(*args: Any, **kwargs: Any) -> Any:
            calls[name] += 1
            return real(*args, **kwargs)

        return count

    check = counted("checks", plans.check_record)
    for module in (plans, stashers):
        monkeypatch.setattr(module, "check_record", check)
    monkeypatch.setattr(StashLimits, "check", counted("limits", StashLimits.check))
    monkeypatch.setattr(plans.StashPlan, "make", classmethod(counted("plans", plans.StashPlan.make.__func__)))
