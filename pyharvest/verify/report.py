"""The outcome of a check: what was lost, reordered, duplicated or unexpected.

Guarantee: :attr:`VerifyReport.ok` is true only when nothing expected was lost, nothing was
reordered and nothing unexpected arrived (one-off duplicates are allowed and counted);
examples are capped, counts never are, and the report is frozen.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pyharvest.verify.identity_spec import Identity, Key

__all__ = ["Duplicate", "Reorder", "VerifyReport"]


@dataclass(frozen=True, slots=True)
class Duplicate:
    """A record received more than once in a row: allowed, but counted."""

    key: Key
    identity: Identity
    extra_copies: int


@dataclass(frozen=True, slots=True)
class Reorder:
    """A record received after a later record of the same key: never allowed.

    ``position`` is the 0-based index of the offending message among the messages of its
    key; ``expected_index`` is where the record sits in the key's expected order, and
    ``after`` / ``after_index`` the furthest record (by expected order) already received
    at that point — the record itself when it is a repeat that is not immediate.
    ``excerpt`` is the key's received sequence from ``excerpt_start`` on, around
    ``position``; :meth:`__str__` marks the offender with ``>...<``.
    """

    key: Key
    position: int
    identity: Identity
    expected_index: int
    after: Identity
    after_index: int
    excerpt: tuple[Identity, ...] = ()
    excerpt_start: int = 0

    def __str__(self) -> str:
        shown = [
            f">{_short(x)}<" if self.excerpt_start + i == self.position else _short(x)
            for i, x in enumerate(self.excerpt)
        ]
        prefix = "... " if self.excerpt_start > 0 else ""
        what = (
            "repeated, not immediately,"
            if self.after_index == self.expected_index
            else f"came after #{self.after_index} ({_short(self.after)}),"
        )
        return (
            f"key {_short(self.key)}: #{self.expected_index} ({_short(self.identity)}) {what} "
            f"at position {self.position}: {prefix}{' '.join(shown)}"
        )


@dataclass(frozen=True)
class VerifyReport:
    """The outcome of :func:`verify`.

    ``ok`` means no loss, no reorder and nothing unexpected; duplicates are allowed (at
    least once) and only counted. ``lost`` maps each key to its expected identities that
    never arrived, in expected order. ``reordered`` maps each key to (at most
    ``max_examples``) violations; ``reorder_count`` counts them all. ``duplicates`` holds a
    few examples; ``duplicate_count`` is the number of extra copies received.
    ``unexpected`` lists (key, identity) received but never expected, in received order
    (at most ``max_examples``; ``unexpected_count`` counts them all).
    """

    expected_count: int
    received_count: int
    lost: Mapping[Key, tuple[Identity, ...]] = field(default_factory=dict, hash=False)
    duplicate_count: int = 0
    duplicates: tuple[Duplicate, ...] = ()
    reorder_count: int = 0
    reordered: Mapping[Key, tuple[Reorder, ...]] = field(default_factory=dict, hash=False)
    unexpected_count: int = 0
    unexpected: tuple[tuple[Key, Identity], ...] = ()

    @property
    def lost_count(self) -> int:
        return sum(len(v) for v in self.lost.values())

    @property
    def ok(self) -> bool:
        return not self.lost and self.reorder_count == 0 and self.unexpected_count == 0

    def __str__(self) -> str:
        headline = (
            f"{'OK' if self.ok else 'FAILED'}: expected {self.expected_count}, received {self.received_count}; "
            f"lost {self.lost_count}, reordered {self.reorder_count}, duplicates {self.duplicate_count}, "
            f"unexpected {self.unexpected_count}"
        )
        lines = [headline]
        if self.lost:
            lines.append(f"lost ({self.lost_count} records in {len(self.lost)} keys):")
            for key, ids in _first(self.lost.items(), 10):
                more = f" ... (+{len(ids) - 10})" if len(ids) > 10 else ""
                lines.append(f"  key {_short(key)}: {', '.join(_short(i) for i in ids[:10])}{more}")
            if len(self.lost) > 10:
                lines.append(f"  ... and {len(self.lost) - 10} more keys")
        if self.reorder_count:
            lines.append(f"reordered ({self.reorder_count} in {len(self.reordered)} keys):")
            shown = [r for rs in self.reordered.values() for r in rs]
            lines.extend(f"  {r}" for r in shown[:10])
            if self.reorder_count > min(len(shown), 10):
                lines.append(f"  ... and {self.reorder_count - min(len(shown), 10)} more")
        if self.duplicate_count:
            lines.append(f"duplicates (allowed; {self.duplicate_count} extra copies), e.g.:")
            lines.extend(
                f"  key {_short(d.key)}: {_short(d.identity)} x{d.extra_copies + 1}" for d in self.duplicates[:5]
            )
        if self.unexpected_count:
            lines.append(f"unexpected ({self.unexpected_count} received but never expected), e.g.:")
            lines.extend(f"  key {_short(k)}: {_short(i)}" for k, i in self.unexpected[:5])
        return "\n".join(lines)


def _first(items: Iterable[Any], n: int) -> list[Any]:
    out: list[Any] = []
    for x in items:
        if len(out) >= n:
            break
        out.append(x)
    return out


def _short(x: object, limit: int = 40) -> str:
    if isinstance(x, bytes):
        with contextlib.suppress(UnicodeDecodeError):
            x = x.decode()
    s = x if isinstance(x, str) else repr(x)
    return s if len(s) <= limit else s[: limit - 3] + "..."
