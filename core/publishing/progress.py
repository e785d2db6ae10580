"""The exactly-once publisher's records in Kafka: each shard's ``transactional.id`` and
producer settings, the progress record (which outbox ids a transaction carried), and the
start-up check that the cluster runs transactions as exactly-once needs them.

How they are used, and why that publishes each record once: :mod:`pyharvest.core.publishing.transactional`.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence

from pyharvest.core.config.kafka_acls import transactional_id_prefix
from pyharvest.core.config.settings import Config
from pyharvest.core.errors import ConfigError, HarvestError, KafkaAuthorizationError
from pyharvest.core.ports.kafka import KafkaClients, TopicError, TransactionalKafkaClients, TransactionError
from pyharvest.core.publishing.sender import producer_config

__all__ = [
    "TRANSACTION_CALL_SECONDS",
    "check_transactions",
    "decode_progress",
    "encode_progress",
    "transactional_clients",
    "transactional_config",
    "transactional_id",
]

PROGRESS_FORMAT = 1

# librdkafka's default. A leader that dies inside a transaction leaves it open until its
# successor's fence aborts it (within the group's session) or this passes; meanwhile
# read_committed consumers of the partitions it wrote to wait.
DEFAULT_TRANSACTION_TIMEOUT_MS = 60_000

# How long a commit, an abort or a fence may take before the producer is given up on.
TRANSACTION_CALL_SECONDS = 30.0


def transactional_id(leader_group_id: str, shard: int) -> str:
    """The ``transactional.id`` of a shard's producers: the same for every leader the shard
    ever has, so that each new one fences the last."""
    return f"{transactional_id_prefix(leader_group_id)}{shard}"


def transactional_config(config: Config, shard: int) -> dict[str, object]:
    cfg = producer_config(config)
    cfg["transactional.id"] = transactional_id(config.leader_group_id, shard)
    cfg.setdefault("transaction.timeout.ms", DEFAULT_TRANSACTION_TIMEOUT_MS)
    return cfg


def encode_progress(leader_id: str, ids: Sequence[int]) -> bytes:
    """A progress record: the outbox ids a transaction carries, as runs of consecutive ids
    (a mark takes the oldest rows, so a batch of thousands is usually one run)."""
    runs: list[list[int]] = []
    for i in sorted(ids):
        if runs and runs[-1][1] + 1 == i:
            runs[-1][1] = i
        elif not runs or runs[-1][1] != i:
            runs.append([i, i])
    return json.dumps({"v": PROGRESS_FORMAT, "leader": leader_id, "ids": runs}, separators=(",", ":")).encode()


def decode_progress(value: bytes) -> list[int]:
    """The outbox ids a progress record names; raises :class:`ValueError` on a record this
    version cannot read (a newer format, or not a progress record at all)."""
    data = json.loads(value)
    if not isinstance(data, dict) or data.get("v") != PROGRESS_FORMAT or not isinstance(data.get("ids"), list):
        raise ValueError(f"not a progress record of format {PROGRESS_FORMAT}: {value[:80]!r}")
    ids: list[int] = []
    for run in data["ids"]:
        first, last = int(run[0]), int(run[1])
        ids.extend(range(first, last + 1))
    return ids


def transactional_clients(kafka: KafkaClients) -> TransactionalKafkaClients:
    """``kafka``, if it can publish exactly once; a :class:`ConfigError` naming it if not."""
    if not isinstance(kafka, TransactionalKafkaClients):
        raise ConfigError(
            "delivery", f"exactly-once needs Kafka clients with transactions; {type(kafka).__name__} has none"
        )
    return kafka


def check_transactions(kafka: KafkaClients, config: Config) -> None:
    """Refuse to start exactly-once publishing where it cannot work: clients without
    transactions, a cluster without them, or a progress topic too small for the shards."""
    kafka = transactional_clients(kafka)
    servers = config.base_kafka_config.get("bootstrap.servers")
    try:
        kafka.ensure_progress_topic(config.base_kafka_config, config.progress_topic, config.shards + 1)
    except KafkaAuthorizationError:
        raise
    except TopicError as e:
        raise HarvestError(f"delivery: exactly-once: {e}") from None
    # An id of its own, never a shard's: initialising it fences no leader; and never another
    # process's, whose probe it would fence when both start at once (Kafka forgets an idle id
    # after transactional.id.expiration.ms, 7 days). Its partition is one past the shards': a
    # leader's open transaction there would hold the probe's read_committed read back.
    # After the last dot, like a shard's number: one prefixed ACL, pyharvest.<group>., covers both.
    probe_id = f"{transactional_id_prefix(config.leader_group_id)}probe-{uuid.uuid4().hex[:12]}"
    probe_config = {**producer_config(config), "transactional.id": probe_id}
    try:
        kafka.probe_transactions(probe_config, config.progress_topic, config.shards, TRANSACTION_CALL_SECONDS)
    except TransactionError as e:
        raise HarvestError(
            f"delivery: exactly-once needs a Kafka cluster with transactions, and the one at "
            f"bootstrap.servers={servers!r} did not initialise a transactional producer ({e}). "
            "Use Apache Kafka (or another broker with transactions), or delivery: at-least-once; "
            "the embedded development broker has no transactions"
        ) from None
