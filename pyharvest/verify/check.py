"""The check: received messages against the records expected, per key, in one pass.

The harvester promises *at-least-once, in causal order per key*. Under that promise a
record may be published more than once, but only as a *one-off duplicate*: a copy that
immediately follows the original (R0 R1 R1 R2, or R0 R1 R1 R1 R2). A record that reappears
after a later record of its key was seen (R0 R1 R2 R1, or the replay R0 R1 R2 R0 R1 R2) is
a *reorder*, as is plain R0 R2 R1; MP/R's per-key in-flight barrier exists to make these
impossible. A record that never arrives is *lost* (R0 R2 with R1 missing is a loss, not a
reorder). See goharvest's FAQ, "Why throttle in-flight records by key?".

Guarantee: each received message is judged exactly once (progress, a one-off duplicate, a
reorder or unexpected), and an expected record is reported lost only if it never arrived:
one that arrives late is a reorder, not a loss. O(n) time, O(expected + keys) memory, so it
is fine for millions of messages.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from types import MappingProxyType
from typing import Final

from pyharvest.core.outbox.records import OutboxRecord
from pyharvest.verify.identity_spec import Identity, Key, record_identity
from pyharvest.verify.report import Duplicate, Reorder, VerifyReport

__all__ = ["verify"]

_EXCERPT_BEFORE: Final = 3
_EXCERPT_AFTER: Final = 2


class _KeyState:
    """Progress through one key's expected sequence.

    ``pos`` is the index of the furthest expected record received so far (-1: none yet),
    ``prev`` the identity of the key's previous message (for one-off duplicates) and
    ``skipped`` the indices jumped over and not received since. The identity index
    (``where``) and ``cursor[id]`` — how many occurrences of ``id`` (an identity may repeat
    within a key) lie at or before ``pos``, so looking ahead is O(1) amortised — are built
    only for keys that stray from the plain path, which keeps a million one-record keys cheap.
    """

    __slots__ = ("_where", "cursor", "expected", "pos", "prev", "received", "skipped")

    def __init__(self) -> None:
        self.expected: list[Identity] = []
        self._where: dict[Identity, list[int]] | None = None
        self.cursor: dict[Identity, int] | None = None
        self.skipped: set[int] | None = None
        self.pos = -1
        self.prev: Identity = _NOTHING
        self.received = 0

    @property
    def where(self) -> dict[Identity, list[int]]:
        if self._where is None:
            self._where = {}
            for i, ident in enumerate(self.expected):
                self._where.setdefault(ident, []).append(i)
        return self._where

    def next_index(self, identity: Identity) -> int | None:
        """The first index of ``identity`` after ``pos``, or None."""
        idx = self.where.get(identity)
        if idx is None:
            return None
        if self.cursor is None:
            self.cursor = {}
        c = self.cursor.get(identity, 0)
        while c < len(idx) and idx[c] <= self.pos:
            c += 1
        self.cursor[identity] = c
        return idx[c] if c < len(idx) else None

    def last_index_before(self, identity: Identity) -> int:
        """The latest index of ``identity`` at or before ``pos`` (it must have one)."""
        assert self.cursor is not None  # next_index ran first
        return self.where[identity][self.cursor[identity] - 1]

    def lost(self) -> tuple[Identity, ...]:
        indices = sorted(self.skipped or ()) + list(range(self.pos + 1, len(self.expected)))
        return tuple(self.expected[i] for i in indices)


_NOTHING: Final = object()


def verify(
    expected: Iterable[tuple[Key, Identity]] | Iterable[OutboxRecord],
    received: Iterable[tuple[Key, Identity]],
    *,
    identity: str = "value",
    max_examples: int = 10,
) -> VerifyReport:
    """Check ``received`` (key, identity) messages against ``expected`` ones.

    ``expected`` lists each key's records in the causal order they were stashed (pairs, or
    :class:`OutboxRecord` objects whose identity ``identity`` picks: ``"value"`` or
    ``"header:NAME"``, as bytes). ``received`` is what was read, in read order per
    partition; since a key lives in one partition, per-key order is read order, and
    interleaving partitions is fine. Identities compare with ``==``: don't mix ``str`` and
    ``bytes`` (:func:`verify_topic` does the conversion for you).

    Each received message is, in this order of preference: the key's next expected record
    (progress); an immediate repeat of the previous message (a duplicate); a later expected
    record (progress, skipping records that are lost unless they show up later, which is
    then a reorder); an earlier expected record (a reorder); or unexpected.
    """
    states: dict[Key, _KeyState] = {}
    expected_count = 0
    key: Key
    ident: Identity
    for item in expected:
        if isinstance(item, OutboxRecord):
            key, ident = item.key, record_identity(item, identity)
        else:
            key, ident = item
        st = states.get(key)
        if st is None:
            st = states[key] = _KeyState()
        st.expected.append(ident)
        expected_count += 1

    msgs = received if isinstance(received, Sequence) else list(received)
    dup_count = 0
    dup_examples: dict[tuple[Key, Identity], int] = {}
    reorders: list[Reorder] = []
    reorder_count = 0
    reorder_per_key: dict[Key, int] = defaultdict(int)
    unexpected: list[tuple[Key, Identity]] = []
    unexpected_count = 0
    empty = _KeyState()

    for key, ident in msgs:
        st = states.get(key, empty)
        position = st.received
        if st is not empty:
            st.received += 1
        exp = st.expected
        nxt = st.pos + 1
        if nxt < len(exp) and exp[nxt] == ident:  # the next one: progress
            st.pos = nxt
        elif ident == st.prev:  # an immediate repeat: a one-off duplicate
            dup_count += 1
            pair = (key, ident)
            if pair in dup_examples or len(dup_examples) < max_examples:
                dup_examples[pair] = dup_examples.get(pair, 0) + 1
        elif (j := st.next_index(ident)) is not None:  # a later one: progress past a gap
            if j > nxt:
                if st.skipped is None:
                    st.skipped = set()
                st.skipped.update(range(nxt, j))
            st.pos = j
        elif ident in st.where:  # an earlier one: reorder
            reorder_count += 1
            i = st.last_index_before(ident)
            if st.skipped:
                st.skipped.discard(i)  # it did arrive: reordered, not lost
            if reorder_per_key[key] < max_examples:
                reorder_per_key[key] += 1
                reorders.append(Reorder(key, position, ident, i, exp[st.pos], st.pos))
        else:  # unexpected: not part of the key's order, so it leaves ``prev`` alone
            unexpected_count += 1
            if len(unexpected) < max_examples:
                unexpected.append((key, ident))
            continue
        st.prev = ident

    lost = {
        key: st.lost() for key, st in states.items() if st.skipped or st.pos + 1 < len(st.expected)
    }
    return VerifyReport(
        expected_count=expected_count,
        received_count=len(msgs),
        lost=MappingProxyType(lost),
        duplicate_count=dup_count,
        duplicates=tuple(Duplicate(k, i, n) for (k, i), n in dup_examples.items()),
        reorder_count=reorder_count,
        reordered=MappingProxyType(_with_excerpts(reorders, msgs)),
        unexpected_count=unexpected_count,
        unexpected=tuple(unexpected),
    )


def _with_excerpts(reorders: list[Reorder], msgs: Sequence[tuple[Key, Identity]]) -> dict[Key, tuple[Reorder, ...]]:
    """Fill in each violation's excerpt with a second pass over the messages of the few
    offending keys, rather than keeping a window of history for every key in the first."""
    if not reorders:
        return {}
    wanted: dict[Key, list[Reorder]] = defaultdict(list)
    for r in reorders:
        wanted[r.key].append(r)
    windows: dict[Key, list[tuple[int, int]]] = {
        k: [(r.position - _EXCERPT_BEFORE, r.position + _EXCERPT_AFTER) for r in rs] for k, rs in wanted.items()
    }
    last_needed = {k: max(hi for _, hi in w) for k, w in windows.items()}
    collected: dict[Key, dict[int, Identity]] = defaultdict(dict)
    counts: dict[Key, int] = defaultdict(int)
    for key, ident in msgs:
        if key not in windows:
            continue
        p = counts[key]
        counts[key] = p + 1
        if p > last_needed[key]:
            continue
        if any(lo <= p <= hi for lo, hi in windows[key]):
            collected[key][p] = ident
    out: dict[Key, tuple[Reorder, ...]] = {}
    for key, rs in wanted.items():
        got = collected[key]
        filled = []
        for r in rs:
            start = max(0, r.position - _EXCERPT_BEFORE)
            span = [got[p] for p in range(start, r.position + _EXCERPT_AFTER + 1) if p in got]
            filled.append(
                Reorder(r.key, r.position, r.identity, r.expected_index, r.after, r.after_index, tuple(span), start)
            )
        out[key] = tuple(filled)
    return out
