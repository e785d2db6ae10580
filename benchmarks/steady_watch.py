"""The consumer of a steady-load run: times every record and checks that none is lost.

    python -m benchmarks.steady_watch WATCH     # WATCH: a JSON :class:`Watch`

A ``read_committed`` consumer of the run's two topics, in a process of its own. For each
record (first copy only) it takes three latencies, in ms from the moment the writer's commit
returned (read from the writer's commits file, :mod:`benchmarks.steady_load`):

* ``create``: the Kafka timestamp of a record on the CreateTime topic (set when the
  harvester's producer took it);
* ``append``: the Kafka timestamp of a record on the LogAppendTime topic (set by the broker
  as it appended it);
* ``visible``: when this consumer received it (exactly once: after its transaction committed).

Records are grouped by when they were committed: one group per ``interval`` seconds (the
soak's minutes), or one for the whole run (``interval`` 0) after ``warmup`` seconds. Each
group is printed as a JSON line once it can no longer grow (``grace`` seconds after it
ends), with p50/p99/p99.9/max of each latency, and the backlog (committed, not yet in Kafka)
at its end. The run ends when the writer's ``end`` line is read and every record it
committed has been seen, or ``drain`` seconds after it; the last line (``"final"``) gives the
records lost, reordered within their key, and duplicated, and the backlog second by second.
"""

from __future__ import annotations

import json
import math
import sys
import threading
import time
from array import array
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from benchmarks.steady_load import commits_path

__all__ = ["Watch", "arrived", "dumps", "histogram", "histogram_quantile", "percentile", "summary"]


def arrived(consumer: Any, most: int, wait: float) -> list[Any]:
    """The messages already there (up to ``most``), else those from the first that arrives
    within ``wait``: ``consume(n, timeout)`` waits for n messages or the whole timeout, so a
    lone message would be timed late by up to the timeout."""
    messages = consumer.consume(most, 0)
    if messages:
        return list(messages)
    first = consumer.poll(wait)
    return [first, *consumer.consume(most, 0)] if first is not None else []


@dataclass
class Watch:
    bootstrap: str
    topics: list[str]  # [CreateTime topic, LogAppendTime topic]
    keys: int
    commits: str
    writers: int = 1
    interval: float = 0.0
    groups: int = 0  # with interval: how many; records committed after the last one's end count in it
    warmup: float = 0.0
    grace: float = 10.0
    drain: float = 120.0
    visible_out: str | None = None  # seq-indexed receive times, for the trace's stages
    group: str = "steady-watch"


def dumps(w: Watch) -> str:
    return json.dumps(asdict(w))


#: Latency histograms' buckets grow by 2%: bucket b holds values up to HIST_BASE * HIST_STEP**b ms.
HIST_BASE, HIST_STEP = 0.1, 1.02


def histogram(values: list[float]) -> dict[int, int]:
    """``values`` (ms) counted in 2%-wide buckets, for groups to be merged later (the soak's
    first and last ten minutes); everything at or below ``HIST_BASE`` goes in bucket 0."""
    out: Counter[int] = Counter()
    log_step = math.log(HIST_STEP)
    for v in values:
        out[0 if v <= HIST_BASE else math.ceil(math.log(v / HIST_BASE) / log_step)] += 1
    return dict(out)


def histogram_quantile(hist: dict[int, int], q: float) -> float:
    """The q-quantile (ms, to 2%) of a merged :func:`histogram`."""
    total = sum(hist.values())
    rank, seen = max(1, math.ceil(q * total)), 0
    for b in sorted(hist):
        seen += hist[b]
        if seen >= rank:
            return HIST_BASE * HIST_STEP**b
    return float("nan")


def percentile(values: Sequence[float], q: float) -> float:
    """The q-quantile of sorted ``values`` (nearest rank)."""
    return values[min(len(values) - 1, max(0, int(q * len(values) + 0.5) - 1))] if values else float("nan")


def summary(values: list[float]) -> dict[str, float | int]:
    """n, p50, p99, p99.9 and max of ``values`` (sorted in place)."""
    values.sort()
    if not values:
        return {"n": 0}
    return {"n": len(values), "p50": round(percentile(values, 0.5), 2), "p99": round(percentile(values, 0.99), 2),
            "p999": round(percentile(values, 0.999), 2), "max": round(values[-1], 2)}


@dataclass
class _Group:
    create: list[float] = field(default_factory=list)
    append: list[float] = field(default_factory=list)
    visible: list[float] = field(default_factory=list)


class _Commits:
    """The writers' commits files, read as they grow."""

    def __init__(self, path: str, writers: int) -> None:
        self._files = [open(commits_path(path, w, writers)) for w in range(writers)]  # noqa: SIM115 - for the run
        self._partial = [""] * writers
        self._ends: list[int | None] = [None] * writers
        self.start: float | None = None
        self.returned: dict[int, float] = {}  # batch → when its commit returned
        self.committed: Counter[int] = Counter()  # second → records committed
        self.total = 0

    @property
    def end(self) -> int | None:
        """Every writer's records, once each has written its last."""
        return None if None in self._ends else sum(self._ends)  # type: ignore[arg-type]

    @property
    def per_writer(self) -> list[int]:
        return [e or 0 for e in self._ends]

    def read(self) -> None:
        for w, f in enumerate(self._files):
            chunk = f.read()
            if not chunk:
                continue
            lines = (self._partial[w] + chunk).split("\n")
            self._partial[w] = lines.pop()
            for line in lines:
                parts = line.split()
                if parts[0] == "start":
                    self.start = min(self.start or float(parts[1]), float(parts[1]))
                elif parts[0] == "end":
                    self._ends[w] = int(parts[1])
                else:
                    n, returned = int(parts[2]), float(parts[4])
                    self.returned[int(parts[0])] = returned
                    self.committed[int(returned)] += n
                    self.total += n


class Watcher:
    def __init__(self, w: Watch) -> None:
        self.w = w
        self.commits = _Commits(w.commits, w.writers)
        self.seen = bytearray(1 << 16)
        self.last = array("q", [-1]) * w.keys
        self.distinct = self.duplicates = self.reordered = self.late = 0
        self.published: Counter[int] = Counter()  # second (Kafka timestamp) → records
        self.groups: dict[int, _Group] = {}
        self.flushed = -1  # every group up to this one was printed
        self.pending: list[tuple[int, int, int, int, float]] = []
        self.visible_at = array("d") if w.visible_out else None
        self.stop = threading.Event()

    def group_of(self, returned: float) -> int:
        start = self.commits.start or 0.0
        if self.w.interval > 0:
            g = int((returned - start) / self.w.interval)
            return min(g, self.w.groups - 1) if self.w.groups else g
        return 0 if returned >= start + self.w.warmup else -1

    def take(self, seq: int, batch: int, kind: int, ts_ms: int, received: float) -> None:
        returned = self.commits.returned.get(batch)
        if returned is None:
            self.pending.append((seq, batch, kind, ts_ms, received))
            return
        g = self.group_of(returned)
        if g <= self.flushed and g >= 0:
            self.late += 1
            return
        group = self.groups.setdefault(g, _Group())
        (group.create if kind == 0 else group.append).append(ts_ms - returned * 1000)
        group.visible.append((received - returned) * 1000)

    def on_message(self, topic_kind: int, value: bytes, ts_ms: int, received: float) -> None:
        seq, batch = int(value[:12]), int(value[13:23])
        seen = self.seen
        while seq >= len(seen):
            seen.extend(bytes(len(seen)))
        if seen[seq]:
            self.duplicates += 1
            return
        seen[seq] = 1
        self.distinct += 1
        k = seq % self.w.keys
        if seq < self.last[k]:
            self.reordered += 1
        else:
            self.last[k] = seq
        self.published[ts_ms // 1000] += 1
        if self.visible_at is not None:
            while seq >= len(self.visible_at):
                self.visible_at.extend(array("d", bytes(8 * max(1024, len(self.visible_at)))))
            self.visible_at[seq] = received
        self.take(seq, batch, topic_kind, ts_ms, received)

    def backlog_at(self, t: float) -> int:
        second = int(t)
        return (sum(n for s, n in self.commits.committed.items() if s < second)
                - sum(n for s, n in self.published.items() if s < second))

    def emit(self, g: int, end: float) -> None:
        group = self.groups.pop(g, _Group())
        line: dict[str, object] = {"group": g, "create": summary(group.create), "append": summary(group.append),
                                   "visible": summary(group.visible)}
        if self.w.interval > 0:
            line["backlog_at_end"] = self.backlog_at(end)
            lo, hi = int(end - self.w.interval), int(end)
            line["committed"] = sum(n for s, n in self.commits.committed.items() if lo <= s < hi)
            line["published"] = sum(n for s, n in self.published.items() if lo <= s < hi)
            line["create_hist"] = histogram(group.create)
            line["visible_hist"] = histogram(group.visible)
        print(json.dumps(line), flush=True)

    def flush_due(self, now: float, everything: bool = False) -> None:
        if self.commits.start is None or self.w.interval <= 0:
            return
        while True:
            g = self.flushed + 1
            end = self.commits.start + (g + 1) * self.w.interval
            if not everything and now < end + self.w.grace:
                return
            if everything and g not in self.groups and end > now:
                return
            self.emit(g, min(end, now))
            self.flushed = g

    def run(self) -> None:
        from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

        c = Consumer({"bootstrap.servers": self.w.bootstrap, "group.id": self.w.group,
                      "enable.auto.commit": False, "isolation.level": "read_committed",
                      "fetch.wait.max.ms": 10, "enable.partition.eof": False})
        kinds = {t: i for i, t in enumerate(self.w.topics)}
        metadata = c.list_topics(timeout=15)
        c.assign([TopicPartition(t, p, OFFSET_BEGINNING) for t in self.w.topics for p in metadata.topics[t].partitions])
        print(json.dumps({"ready": True}), flush=True)
        ended_at: float | None = None
        commits = self.commits
        while not self.stop.is_set():
            messages = arrived(c, 5000, 0.02)
            received = time.time()
            commits.read()
            for m in messages:
                if m.error() is None:
                    self.on_message(kinds[m.topic()], m.value(), m.timestamp()[1], received)
            if self.pending:
                pending, self.pending = self.pending, []
                for p in pending:
                    self.take(*p)
            self.flush_due(received)
            if commits.end is not None:
                ended_at = ended_at or received
                if self.distinct >= commits.end or received - ended_at > self.w.drain:
                    break
        c.close()
        commits.read()
        self.finish()

    def lost(self) -> int:
        """Records a writer committed that never arrived (writer w's are w, w + W, w + 2W, ...)."""
        ws = self.w.writers
        return sum(n - self.seen[w::ws][:n].count(1) for w, n in enumerate(self.commits.per_writer))

    def finish(self) -> None:
        if self.w.interval > 0:
            self.flush_due(time.time(), everything=True)
        else:
            for g in sorted(self.groups):
                self.emit(g, time.time())
        total = self.commits.end if self.commits.end is not None else self.commits.total
        if self.visible_at is not None and self.w.visible_out:
            with open(self.w.visible_out, "wb") as f:
                self.visible_at.tofile(f)
        start = int(self.commits.start or 0)
        seconds = sorted(set(self.commits.committed) | set(self.published))
        backlog, cum = [], 0
        for s in range(start, (seconds[-1] + 1) if seconds else start):
            cum += self.commits.committed.get(s, 0) - self.published.get(s, 0)
            backlog.append(cum)
        print(json.dumps({"final": True, "committed": total, "received": self.distinct,
                          "lost": self.lost(),
                          "reordered": self.reordered, "duplicates": self.duplicates, "late": self.late,
                          "unmatched": len(self.pending), "backlog_per_second": backlog}), flush=True)


def main(argv: list[str]) -> int:
    watcher = Watcher(Watch(**json.loads(argv[0])))

    def stdin() -> None:
        for line in sys.stdin:
            if line.strip() == "stop":
                break
        watcher.stop.set()

    threading.Thread(target=stdin, daemon=True).start()
    watcher.run()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
