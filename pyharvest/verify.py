"""Check what reached a topic against what was stashed in the outbox: nothing lost, nothing
reordered, nothing unexpected.

The harvester promises *at-least-once, in causal order per key*. Under that promise a
record may be published more than once, but only as a *one-off duplicate*: a copy that
immediately follows the original (R0 R1 R1 R2, or R0 R1 R1 R1 R2). A record that reappears
after a later record of its key was seen (R0 R1 R2 R1, or the replay R0 R1 R2 R0 R1 R2) is
a *reorder*, as is plain R0 R2 R1; MP/R's per-key in-flight barrier exists to make these
impossible. A record that never arrives is *lost* (R0 R2 with R1 missing is a loss, not a
reorder). See goharvest's FAQ, "Why throttle in-flight records by key?".

:func:`verify` does the check in one pass over the messages (O(n) time, O(expected +
keys) memory), so it is fine for millions of messages. :func:`verify_topic` reads a whole
topic back with confluent-kafka and verifies it.

>>> report = verify([("k", "R0"), ("k", "R1"), ("k", "R2")],
...                 [("k", "R0"), ("k", "R1"), ("k", "R1"), ("k", "R2")])
>>> report.ok, report.duplicate_count
(True, 1)
"""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Final

from pyharvest.core.records import OutboxRecord

__all__ = [
    "Duplicate",
    "IdentitySpec",
    "Reorder",
    "VerifyError",
    "VerifyReport",
    "expected_from_records",
    "parse_identity",
    "verify",
    "verify_topic",
]

log = logging.getLogger(__name__)

Key = Hashable
Identity = Hashable
#: How a message is identified: ``"value"`` (the value bytes), ``"header:NAME"`` (the bytes
#: of header NAME; ``None`` if absent), or a function of a confluent-kafka ``Message``.
IdentitySpec = str | Callable[[Any], Identity]

_EXCERPT_BEFORE: Final = 3
_EXCERPT_AFTER: Final = 2


class VerifyError(RuntimeError):
    """The check could not be run (bad identity spec, topic missing, broker unreachable)."""


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


# ---------------------------------------------------------------------- identities


def parse_identity(spec: IdentitySpec) -> Callable[[Any], Identity]:
    """Turn ``"value"``, ``"header:NAME"`` or a callable into a function of a Kafka message.

    Identities read from Kafka are bytes (or ``None``: a tombstone, a missing header).
    """
    if callable(spec):
        return spec
    if spec == "value":
        return lambda m: m.value()
    if isinstance(spec, str) and spec.startswith("header:") and len(spec) > len("header:"):
        name = spec[len("header:"):]

        def header(m: Any) -> Identity:
            for k, v in m.headers() or ():
                if k == name:
                    return v  # type: ignore[no-any-return]
            return None

        return header
    raise VerifyError(f"identity must be 'value' or 'header:NAME', got {spec!r}")


def _record_identity(record: OutboxRecord, spec: str) -> Identity:
    if spec == "value":
        return record.value_bytes()
    if spec.startswith("header:"):
        name = spec[len("header:"):]
        for k, v in record.headers:
            if k == name:
                return v.encode() if isinstance(v, str) else v
        return None
    raise VerifyError(f"identity of an OutboxRecord must be 'value' or 'header:NAME', got {spec!r}")


def expected_from_records(records: Iterable[OutboxRecord], identity: str = "value") -> list[tuple[Key, Identity]]:
    """(key, identity) pairs for records in the order they were stashed; identities are
    bytes, the way :func:`verify_topic` reads them from Kafka."""
    return [(r.key, _record_identity(r, identity)) for r in records]


def _as_bytes(x: Identity) -> Identity:
    return x.encode() if isinstance(x, str) else x


# ---------------------------------------------------------------------- the check


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
            key, ident = item.key, _record_identity(item, identity)
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


# ---------------------------------------------------------------------- reading a topic


def verify_topic(
    bootstrap_servers: str,
    topic: str,
    expected: Iterable[tuple[Key, Identity]] | Iterable[OutboxRecord],
    identity: IdentitySpec = "value",
    timeout: float = 30.0,
    *,
    idle: float = 2.0,
    consumer_config: Mapping[str, object] | None = None,
) -> VerifyReport:
    """Read all of ``topic`` from the beginning and :func:`verify` it against ``expected``.

    Reading stops once at least as many messages as expected were read and none came for
    ``idle`` seconds (duplicates may trail), or after ``timeout`` seconds, whichever comes
    first — what is missing then is reported as lost. The end of a partition is judged by
    counting messages, never by the high watermark (the embedded broker's lags).

    Message keys are decoded as UTF-8 (outbox keys are strings); ``str`` identities in
    ``expected`` are encoded as UTF-8 to compare with the bytes read from Kafka.
    """
    from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition

    get_identity = parse_identity(identity)
    exp = [_expected_pair(item, identity) for item in expected]
    config: dict[str, object] = {
        "bootstrap.servers": bootstrap_servers,
        "group.id": f"pyharvest-verify-{uuid.uuid4().hex[:8]}",  # never joined: partitions are assigned
        "enable.auto.commit": False,
        "enable.partition.eof": False,
        **(consumer_config or {}),
    }
    consumer = Consumer(config)
    try:
        deadline = time.monotonic() + timeout
        partitions = _partitions(consumer, topic, deadline, KafkaException)
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        received: list[tuple[Key, Identity]] = []
        last = time.monotonic()
        while time.monotonic() < deadline:
            batch = consumer.consume(1000, 0.2)
            for m in batch:
                err = m.error()
                if err is not None:
                    if err.fatal() or err.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
                        raise VerifyError(f"cannot read topic {topic!r}: {err}")
                    log.debug("consumer error (retried): %s", err)
                    continue
                received.append((_decode_key(m.key()), get_identity(m)))
            if batch:
                last = time.monotonic()
            elif len(received) >= len(exp) and time.monotonic() - last >= idle:
                break
    finally:
        consumer.close()
    return verify(exp, received)


def _expected_pair(item: tuple[Key, Identity] | OutboxRecord, identity: IdentitySpec) -> tuple[Key, Identity]:
    if isinstance(item, OutboxRecord):
        if not isinstance(identity, str):
            raise VerifyError("with an identity function, give expected (key, identity) pairs, not OutboxRecords")
        return item.key, _record_identity(item, identity)
    key, ident = item
    return key, _as_bytes(ident) if isinstance(identity, str) else ident


def _partitions(consumer: Any, topic: str, deadline: float, kafka_exception: type[Exception]) -> list[int]:
    """The topic's partition ids, waiting a little for a just-created topic's metadata."""
    error: object = None
    while True:
        try:
            md = consumer.list_topics(topic, timeout=max(0.5, min(5.0, deadline - time.monotonic())))
            t = md.topics.get(topic)
            if t is not None and t.error is None and t.partitions:
                return sorted(t.partitions)
            error = t.error if t is not None else "not in metadata"
        except kafka_exception as e:
            error = e
        if time.monotonic() >= deadline:
            raise VerifyError(f"topic {topic!r} is not readable: {error}")
        time.sleep(0.2)


def _decode_key(key: bytes | None) -> Key:
    if key is None:
        return None
    try:
        return key.decode()
    except UnicodeDecodeError:
        return key
