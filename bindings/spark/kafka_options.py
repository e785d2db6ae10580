"""The options of ``spark.readStream.format("pyharvest.kafka")``.

Spark's own connector's names are accepted too (``kafka.bootstrap.servers``, ``subscribe``,
``includeHeaders``), so that a stream moves between the two by its format's name alone.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pyharvest.core.errors import ConfigError

__all__ = ["KafkaOptions", "parse_kafka_options"]

# Option names arrive lower-cased (Spark's options are case-insensitive).
# includeHeaders: the connector's; this source's schema always has the headers column.
_OWN = frozenset(
    {"bootstrap.servers", "topics", "subscribe", "startingoffsets", "maxoffsetspertrigger", "fetchtimeout",
     "includeheaders"}
)
# librdkafka settings the source relies on; a passthrough may not override them.
_RESERVED = frozenset({"enable.partition.eof", "enable.auto.commit", "group.id"})


@dataclass(frozen=True)
class KafkaOptions:
    topics: tuple[str, ...]
    # confluent-kafka settings: bootstrap.servers plus every kafka.* option (may hold credentials).
    client_config: dict[str, Any] = field(repr=False)
    # "earliest", "latest", or {topic: {partition: offset}} (-2 earliest, -1 latest).
    starting: str | dict[str, dict[str, int]] = "latest"
    max_offsets_per_trigger: int | None = None
    fetch_timeout: float = 60.0


def parse_kafka_options(options: Mapping[str, str]) -> KafkaOptions:
    opts = {k.lower(): v for k, v in options.items()}
    unknown = sorted(k for k in opts if k not in _OWN and not k.startswith("kafka."))
    if unknown:
        raise ConfigError(
            "options",
            f"unknown option(s) {', '.join(unknown)}; use bootstrap.servers, topics (or subscribe), startingOffsets, "
            "maxOffsetsPerTrigger, fetchTimeout, and kafka.<librdkafka setting> for anything else",
        )
    config: dict[str, Any] = {k[len("kafka."):]: v for k, v in opts.items() if k.startswith("kafka.")}
    reserved = sorted(_RESERVED & set(config))
    if reserved:
        raise ConfigError(
            "kafka." + reserved[0], "is managed by the source (it reads by explicit offsets, without a group)"
        )
    servers = opts.get("bootstrap.servers") or config.get("bootstrap.servers")
    if not servers:
        raise ConfigError("bootstrap.servers", "required, e.g. .option('bootstrap.servers', 'broker:9092')")
    config["bootstrap.servers"] = servers
    raw_topics = opts.get("topics") or opts.get("subscribe") or ""
    topics = tuple(t.strip() for t in raw_topics.split(",") if t.strip())
    if not topics:
        raise ConfigError("topics", "required: a comma-separated list of topic names")
    starting: str | dict[str, dict[str, int]] = (opts.get("startingoffsets") or "latest").strip()
    if starting not in ("earliest", "latest"):
        try:
            parsed = json.loads(str(starting))
            if not isinstance(parsed, dict) or not all(
                isinstance(v, dict) and all(isinstance(o, int) for o in v.values()) for v in parsed.values()
            ):
                raise ValueError
        except ValueError:
            raise ConfigError(
                "startingOffsets", 'expected "earliest", "latest" or JSON such as {"topic": {"0": 42, "1": -2}}'
            ) from None
        starting = {t: {str(p): int(o) for p, o in v.items()} for t, v in parsed.items()}
    limit = None
    if opts.get("maxoffsetspertrigger"):
        try:
            limit = int(opts["maxoffsetspertrigger"])
            if limit <= 0:
                raise ValueError
        except ValueError:
            raise ConfigError(
                "maxOffsetsPerTrigger", f"expected a positive integer, got {opts['maxoffsetspertrigger']!r}"
            ) from None
    try:
        timeout = float(opts.get("fetchtimeout") or 60.0)
    except ValueError:
        raise ConfigError("fetchTimeout", "expected seconds, e.g. 60") from None
    return KafkaOptions(topics, config, starting, limit, timeout)
