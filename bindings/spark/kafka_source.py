"""``spark.readStream.format("pyharvest.kafka")``: Kafka topics as a stream, via confluent-kafka.

Offsets are ``{topic: {partition: next offset}}``, kept in Spark's checkpoint; nothing is
committed to Kafka and no consumer group is joined: the driver and each task ``assign``
explicit partitions and offsets.

The end of a partition is what a fetch shows, not the listed high watermark: some brokers
(the embedded one among them) report a watermark that lags the partition's real end. The
driver seeks to the reported watermark and reads on until a fetch returns nothing new (or
it has read enough); the end offset is one past the last message actually read.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, cast

import pyarrow as pa
from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.types import StructType

from pyharvest.bindings.spark.kafka_options import KafkaOptions, parse_kafka_options
from pyharvest.core.errors import ConfigError

try:  # Spark >= 4.2: admission control and Trigger.AvailableNow for Python sources
    from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows, SupportsTriggerAvailableNow
except ImportError:  # pragma: no cover - Spark 4.0/4.1
    ReadAllAvailable = ReadMaxRows = None  # type: ignore[assignment,misc]

    class SupportsTriggerAvailableNow:  # type: ignore[no-redef]
        pass

__all__ = ["KAFKA_SCHEMA", "KafkaDataSource", "KafkaRange", "KafkaStreamReader"]

log = logging.getLogger("pyharvest.spark")

KAFKA_SCHEMA = (
    "topic string, partition int, offset long, key binary, value binary, "
    "headers array<struct<key: string, value: binary>>, timestamp timestamp"
)
_ARROW_SCHEMA = pa.schema(
    [
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("headers", pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))),
        ("timestamp", pa.timestamp("us", tz="UTC")),
    ]
)
BATCH_ROWS = 10_000
# How far past the listed watermark one probe reads before settling for what it has read.
PROBE_MAX_MESSAGES = 200_000

Offsets = dict[str, dict[str, int]]


@dataclass(frozen=True)
class KafkaRange(InputPartition):
    topic: str
    partition: int
    start: int
    end: int  # exclusive


class KafkaDataSource(DataSource):
    """Registered as ``pyharvest.kafka`` by :func:`pyharvest.bindings.spark.register`."""

    @classmethod
    def name(cls) -> str:
        return "pyharvest.kafka"

    def schema(self) -> str:
        return KAFKA_SCHEMA

    def streamReader(self, schema: StructType) -> KafkaStreamReader:
        return KafkaStreamReader(parse_kafka_options(dict(self.options)))


def _consumer(config: dict[str, Any]) -> Consumer:
    return Consumer(
        {
            **config,
            # A group id is required by the client but never used: no subscribe, no commits.
            "group.id": f"pyharvest-spark-{uuid.uuid4().hex[:12]}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "auto.offset.reset": config.get("auto.offset.reset", "error"),
            "fetch.wait.max.ms": int(config.get("fetch.wait.max.ms", 100)),
        }
    )


class KafkaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: KafkaOptions) -> None:
        self.options = options
        self._probe: Consumer | None = None  # driver only, created lazily
        self._target: Offsets | None = None  # Trigger.AvailableNow's end
        self._last: Offsets | None = None  # for Spark < 4.2, which calls latestOffset()

    # -- driver --------------------------------------------------------------------------

    def _client(self) -> Consumer:
        if self._probe is None:
            self._probe = _consumer(self.options.client_config)
        return self._probe

    def _partitions(self) -> list[tuple[str, int]]:
        md = self._client().list_topics(timeout=self.options.fetch_timeout)
        out: list[tuple[str, int]] = []
        for t in self.options.topics:
            topic = md.topics.get(t)
            if topic is None or topic.error is not None or not topic.partitions:
                raise ConfigError("topics", f"topic {t!r} does not exist (or has no partitions) on the cluster")
            out.extend((t, p) for p in sorted(topic.partitions))
        return out

    def _ends(self, since: dict[tuple[str, int], int]) -> dict[tuple[str, int], int]:
        """The real end of each partition: seek to max(since, listed watermark) and read until
        a fetch returns nothing new; the end is one past the last message read."""
        c = self._client()
        timeout = self.options.fetch_timeout
        probe: dict[tuple[str, int], int] = {}
        for tp, pos in since.items():
            _low, high = c.get_watermark_offsets(TopicPartition(tp[0], tp[1]), timeout=timeout, cached=False)
            probe[tp] = max(pos, high)
        ends = dict(probe)
        pending = set(probe)
        read = dict.fromkeys(probe, 0)
        c.assign([TopicPartition(t, p, o) for (t, p), o in probe.items()])
        deadline = time.monotonic() + timeout
        try:
            while pending:
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"no end-of-partition from the broker within fetchTimeout={timeout}s for {sorted(pending)}"
                    )
                for m in c.consume(1000, 0.5):
                    err = m.error()
                    if err is not None and err.code() != KafkaError._PARTITION_EOF:
                        raise KafkaException(err)
                    tp, offset = _position(m)
                    if err is not None:  # end of partition: offset is the partition's end
                        ends[tp] = max(ends[tp], offset)
                        pending.discard(tp)
                        continue
                    if tp in pending:
                        ends[tp] = max(ends[tp], offset + 1)
                        read[tp] += 1
                        if read[tp] >= PROBE_MAX_MESSAGES:  # enough for now; the rest comes next batch
                            pending.discard(tp)
        finally:
            c.unassign()
        return ends

    def _earliest(self, tps: list[tuple[str, int]]) -> dict[tuple[str, int], int]:
        c = self._client()
        timeout = self.options.fetch_timeout
        return {
            tp: c.get_watermark_offsets(TopicPartition(tp[0], tp[1]), timeout=timeout, cached=False)[0] for tp in tps
        }

    def initialOffset(self) -> Offsets:
        tps = self._partitions()
        starting = self.options.starting
        earliest = self._earliest(tps)
        if starting == "earliest":
            return _to_json(earliest)
        if starting == "latest":
            return _to_json(self._ends(earliest))
        assert isinstance(starting, dict)
        out: dict[tuple[str, int], int] = {}
        latest: dict[tuple[str, int], int] | None = None
        for tp in tps:
            o = starting.get(tp[0], {}).get(str(tp[1]), -2)
            if o == -1:
                latest = latest if latest is not None else self._ends(earliest)
                o = latest[tp]
            elif o == -2:
                o = earliest[tp]
            out[tp] = o
        return _to_json(out)

    def _known(self, start: Offsets) -> dict[tuple[str, int], int]:
        # New partitions (added since start was recorded) start at their beginning.
        have = _from_json(start)
        tps = self._partitions()
        missing = [tp for tp in tps if tp not in have]
        if missing:
            have.update(self._earliest(missing))
        return have

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = _to_json(self._ends(self._earliest(self._partitions())))

    def getDefaultReadLimit(self) -> Any:
        if self.options.max_offsets_per_trigger and ReadMaxRows is not None:
            return ReadMaxRows(self.options.max_offsets_per_trigger)
        return ReadAllAvailable()

    def latestOffset(self, start: Offsets | None = None, limit: Any = None) -> Offsets:
        if start is None:  # Spark < 4.2: no start, no limit; apply our own option
            start = self._last if self._last is not None else self.initialOffset()
            budget = self.options.max_offsets_per_trigger
        else:
            budget = limit.max_rows if ReadMaxRows is not None and isinstance(limit, ReadMaxRows) else None
        positions = self._known(start)
        if self._target is not None:
            target = _from_json(self._target)
            ends = {tp: max(pos, target.get(tp, pos)) for tp, pos in positions.items()}
        else:
            ends = self._ends(positions)
        result = _to_json(_admit(positions, ends, budget))
        self._last = result
        return result

    def partitions(self, start: Offsets, end: Offsets) -> list[KafkaRange]:
        s, e = _from_json(start), _from_json(end)
        return [KafkaRange(t, p, s.get((t, p), 0), o) for (t, p), o in sorted(e.items()) if o > s.get((t, p), 0)]

    def commit(self, end: Offsets) -> None:
        pass  # offsets live in Spark's checkpoint; Kafka keeps no state for this source

    def stop(self) -> None:
        if self._probe is not None:
            self._probe.close()
            self._probe = None

    # -- tasks ---------------------------------------------------------------------------

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, KafkaRange)
        return read_range(self.options, partition)


def read_range(options: KafkaOptions, r: KafkaRange) -> Iterator[pa.RecordBatch]:
    """Messages [start, end) of one partition as Arrow record batches."""
    c = _consumer(options.client_config)
    try:
        c.assign([TopicPartition(r.topic, r.partition, r.start)])
        position = r.start
        deadline = time.monotonic() + options.fetch_timeout
        cols = _Columns()
        while position < r.end:
            msgs = c.consume(min(BATCH_ROWS, r.end - position), 1.0)
            if not msgs and time.monotonic() > deadline:
                raise TimeoutError(
                    f"{r.topic}[{r.partition}]: offsets {position}..{r.end} not readable within fetchTimeout="
                    f"{options.fetch_timeout}s (they were read once: is the broker down or the data deleted?)"
                )
            for m in msgs:
                err = m.error()
                if err is not None and err.code() != KafkaError._PARTITION_EOF:
                    raise KafkaException(err)
                off = m.offset()
                assert off is not None  # messages and end-of-partition events carry their offset
                if err is not None:  # end of partition
                    if off >= r.end:  # gaps (compaction, transaction markers) end here
                        position = r.end
                    continue
                if off >= r.end:
                    position = r.end
                    break
                cols.offsets.append(off)
                cols.keys.append(m.key())
                cols.values.append(m.value())
                # A consumed message's headers are a list of pairs (the stub also admits a producer's dict).
                h = cast("list[tuple[str, bytes | None]] | None", m.headers())
                if h:
                    cols.header_pairs.extend(h)
                cols.header_ends.append(len(cols.header_pairs))
                cols.timestamps.append(m.timestamp()[1])
                position = off + 1
            if msgs:
                deadline = time.monotonic() + options.fetch_timeout
            if len(cols.offsets) >= BATCH_ROWS:
                yield cols.batch(r)
                cols = _Columns()
        if cols.offsets:
            yield cols.batch(r)
    finally:
        c.close()


class _Columns:
    """One record batch's columns as they are read. Headers are kept flat (all pairs, and where
    each message's end), so the Arrow list array is built from two flat arrays and offsets,
    not from a dict per header."""

    __slots__ = ("header_ends", "header_pairs", "keys", "offsets", "timestamps", "values")

    def __init__(self) -> None:
        self.offsets: list[int] = []
        self.keys: list[bytes | None] = []
        self.values: list[bytes | None] = []
        self.header_pairs: list[tuple[str, bytes | None]] = []
        self.header_ends: list[int] = [0]
        self.timestamps: list[int] = []

    def batch(self, r: KafkaRange) -> pa.RecordBatch:
        n = len(self.offsets)
        names, values = zip(*self.header_pairs, strict=True) if self.header_pairs else ((), ())
        pairs = pa.StructArray.from_arrays([pa.array(names, pa.string()), pa.array(values, pa.binary())],
                                           fields=list(_ARROW_SCHEMA.field("headers").type.value_type))
        headers = pa.ListArray.from_arrays(pa.array(self.header_ends, pa.int32()), pairs)
        return pa.RecordBatch.from_arrays(
            [
                pa.array([r.topic] * n, pa.string()),
                pa.array([r.partition] * n, pa.int32()),
                pa.array(self.offsets, pa.int64()),
                pa.array(self.keys, pa.binary()),
                pa.array(self.values, pa.binary()),
                headers.cast(_ARROW_SCHEMA.field("headers").type),
                pa.array(self.timestamps, pa.timestamp("ms", tz="UTC")).cast(pa.timestamp("us", tz="UTC")),
            ],
            schema=_ARROW_SCHEMA,
        )


def _position(m: Message) -> tuple[tuple[str, int], int]:
    """((topic, partition), offset) of a message or an end-of-partition event, which both carry them."""
    topic, partition, offset = m.topic(), m.partition(), m.offset()
    assert topic is not None and partition is not None and offset is not None
    return (topic, partition), offset


def _admit(
    start: dict[tuple[str, int], int], ends: dict[tuple[str, int], int], budget: int | None
) -> dict[tuple[str, int], int]:
    """Limit a batch to ``budget`` messages, shared among partitions in proportion to their backlog."""
    backlog = {tp: max(0, ends[tp] - start[tp]) for tp in ends}
    total = sum(backlog.values())
    if budget is None or total <= budget:
        return ends
    share = {tp: backlog[tp] * budget // total for tp in backlog}
    left = budget - sum(share.values())
    for tp in sorted(backlog, key=lambda tp: backlog[tp] - share[tp], reverse=True):
        if left <= 0:
            break
        if backlog[tp] > share[tp]:
            share[tp] += 1
            left -= 1
    return {tp: start[tp] + share[tp] for tp in ends}


def _to_json(offsets: dict[tuple[str, int], int]) -> Offsets:
    out: Offsets = {}
    for (t, p), o in sorted(offsets.items()):
        out.setdefault(t, {})[str(p)] = int(o)
    return out


def _from_json(offsets: Offsets) -> dict[tuple[str, int], int]:
    return {(t, int(p)): int(o) for t, parts in offsets.items() for p, o in parts.items()}
