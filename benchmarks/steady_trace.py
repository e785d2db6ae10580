"""Where a steady run's latency goes: the harvester's side of each record, timed.

``steady_bench --trace`` has the harvester child (:mod:`benchmarks.steady_load`) wrap its
binding and its Kafka clients in a :class:`Tracer`, which notes, per record (by the sequence
number in its value): when the mark that took it started and returned, when it was handed to
the producer, when its delivery report came back; per transaction (exactly once) when the
commit returned; per purge its start and end. :func:`stages` joins those with the writer's
commit times and the consumer's receive times into the stages of a record's latency:

    commit returned → mark started      waiting for a mark (the idle pause, the wake-up, the
                                        window: the main loop busy or blocked)
    mark started → mark returned        the mark statement
    mark returned → produce             dispatch (the gate, a key parked behind its predecessor)
    produce → acknowledged              linger, the request, the broker's append, acks=all
    acknowledged → committed            exactly once: waiting for the transaction's commit
    → visible                           a read_committed consumer's fetch

The wrapping costs the harvester a few µs per record: compare traced and untraced runs'
totals, not a traced run with an untraced one.
"""

from __future__ import annotations

import json
import threading
import time
from array import array
from collections.abc import Callable
from typing import Any

__all__ = ["Tracer", "stages"]


def _seq(value: object) -> int:
    return int(bytes(value)[:12]) if isinstance(value, (bytes, bytearray, memoryview)) else -1  # type: ignore[arg-type]


class Tracer:
    def __init__(self, path: str, topics: list[str]) -> None:
        self._path = path
        self._topics = frozenset(topics)
        self._lock = threading.Lock()
        self.mark_seq, self.mark_start, self.mark_end = array("q"), array("d"), array("d")
        self.produce_seq, self.produce_t = array("q"), array("d")
        self.ack_seq, self.ack_t = array("q"), array("d")
        self.commits = array("d")
        self.purges: list[tuple[float, float, int]] = []

    # ------------------------------------------------------------------ the clients

    def clients(self) -> Any:
        from pyharvest.bindings.kafka.transactions import ConfluentTransactionalClients

        tracer = self
        base = ConfluentTransactionalClients()

        class TracedClients(ConfluentTransactionalClients):
            def producer(self, config):  # type: ignore[no-untyped-def]
                return tracer._wrap(base.producer(config))

            def transactional_producer(self, config):  # type: ignore[no-untyped-def]
                return tracer._wrap(base.transactional_producer(config), transactional=True)

        return TracedClients()

    def _wrap(self, producer: Any, transactional: bool = False) -> Any:
        inner_produce = producer.produce
        produce_seq, produce_t, ack_seq, ack_t = self.produce_seq, self.produce_t, self.ack_seq, self.ack_t
        lock, topics = self._lock, self._topics

        def produce(topic, key, value, headers, on_delivery, partition=None):  # type: ignore[no-untyped-def]
            seq = _seq(value) if topic in topics else -1  # not the progress records
            if seq >= 0:
                with lock:
                    produce_seq.append(seq)
                    produce_t.append(time.time())

                def reported(err, inner=on_delivery, seq=seq):  # type: ignore[no-untyped-def]
                    if err is None:
                        with lock:
                            ack_seq.append(seq)
                            ack_t.append(time.time())
                    inner(err)

                on_delivery = reported
            return inner_produce(topic, key, value, headers, on_delivery, partition)

        producer.produce = produce
        if transactional:
            inner_commit, commits = producer.commit_transaction, self.commits

            def commit_transaction(timeout: float) -> None:
                inner_commit(timeout)
                commits.append(time.time())

            producer.commit_transaction = commit_transaction
        return producer

    # ------------------------------------------------------------------ the binding

    def watch(self, harvest: Any) -> None:
        binding = harvest.binding
        inner_mark, inner_purge = binding.mark, binding.purge
        mark_seq, mark_start, mark_end, purges = self.mark_seq, self.mark_start, self.mark_end, self.purges

        def mark(leader_id: str, limit: int) -> Any:
            started = time.time()
            records = inner_mark(leader_id, limit)
            ended = time.time()
            for r in records:
                mark_seq.append(_seq(r.value))
                mark_start.append(started)
                mark_end.append(ended)
            return records

        def purge(ids: Any) -> int:
            started = time.time()
            n = inner_purge(ids)
            purges.append((started, time.time(), len(ids)))
            return n

        binding.mark, binding.purge = mark, purge

    def close(self) -> None:
        with open(self._path, "w") as f:
            json.dump({"mark": [self.mark_seq.tolist(), self.mark_start.tolist(), self.mark_end.tolist()],
                       "produce": [self.produce_seq.tolist(), self.produce_t.tolist()],
                       "ack": [self.ack_seq.tolist(), self.ack_t.tolist()],
                       "commits": self.commits.tolist(), "purges": self.purges}, f)


# ----------------------------------------------------------------------------- analysis


def _first(seqs: list[int], times: list[float]) -> dict[int, float]:
    out: dict[int, float] = {}
    for s, t in zip(seqs, times, strict=True):
        if s not in out:
            out[s] = t
    return out


def stages(trace_path: str, committed: Callable[[int], tuple[float, float] | None], visible: dict[int, float],
           percentile: Callable[[list[float], float], float], skip_before: float) -> dict[str, list[float]]:
    """p50, p99, p99.9 and max (ms) of each stage, over records committed after ``skip_before``.
    ``committed(seq)`` is the writer's (insert started, commit returned) times; ``visible`` the
    consumer's receive times (seq → wall clock)."""
    data = json.loads(open(trace_path).read())
    mark_start = _first(data["mark"][0], data["mark"][1])
    mark_end = _first(data["mark"][0], data["mark"][2])
    produced = _first(*data["produce"])
    acked = _first(*data["ack"])
    commits = sorted(data["commits"])
    parts: dict[str, list[float]] = {k: [] for k in (
        "insert+commit", "commit→mark start", "mark", "mark→produce", "produce→ack", "ack→tx commit", "→visible", "total", "total from insert")}
    import bisect

    for seq, start in mark_start.items():
        times = committed(seq)
        if times is None or times[1] < skip_before or seq not in produced or seq not in acked:
            continue
        c = times[1]
        end, p, a = mark_end[seq], produced[seq], acked[seq]
        parts["insert+commit"].append(c - times[0])
        parts["commit→mark start"].append(start - c)
        parts["mark"].append(end - start)
        parts["mark→produce"].append(p - end)
        parts["produce→ack"].append(a - p)
        last = a
        if commits:
            i = bisect.bisect_left(commits, a)
            if i < len(commits):
                parts["ack→tx commit"].append(commits[i] - a)
                last = commits[i]
        if seq in visible:
            parts["→visible"].append(visible[seq] - last)
            parts["total"].append(visible[seq] - c)
            parts["total from insert"].append(visible[seq] - times[0])
    out = {}
    for name, values in parts.items():
        if values:
            values.sort()
            out[name] = [round(1000 * percentile(values, q), 2) for q in (0.5, 0.99, 0.999, 1.0)]
    out["purges"] = [len(data["purges"]),
                     round(1000 * sum(e - s for s, e, _ in data["purges"]) / max(1, len(data["purges"])), 2)]
    return out
