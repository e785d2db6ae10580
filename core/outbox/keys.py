"""Which shard a record belongs to: a stable function of its key.

A record's **key hash** is Kafka's own: ``murmur2(utf8(key)) & 0x7fffffff``, the function
Apache Kafka's default partitioner applies to a key (``Utils.toPositive(Utils.murmur2(…))``
in the Java client; every Kafka client library ships it). Its **shard** among ``n`` is
``key_hash % n`` — the partition Kafka's default partitioner would choose for the key on a
topic of ``n`` partitions. The hash is stored with the row (``kafka_key_hash``) by whoever
writes it, so it is the same across processes, languages and database versions; a writer in
another language computes it with its Kafka client's murmur2.
"""

from __future__ import annotations

import functools

__all__ = ["key_hash", "shard_of"]

_M = 0x5BD1E995
_SEED = 0x9747B28C
_MASK = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """MurmurHash2 as Kafka computes it (seed ``0x9747b28c``), as an unsigned 32-bit int."""
    length = len(data)
    h = (_SEED ^ length) & _MASK
    end = length - length % 4
    for i in range(0, end, 4):
        k = (data[i] | data[i + 1] << 8 | data[i + 2] << 16 | data[i + 3] << 24) * _M & _MASK
        k ^= k >> 24
        h = (h * _M & _MASK) ^ (k * _M & _MASK)
    rest = length - end
    if rest == 3:
        h ^= data[end + 2] << 16
    if rest >= 2:
        h ^= data[end + 1] << 8
    if rest >= 1:
        h ^= data[end]
        h = h * _M & _MASK
    h ^= h >> 13
    h = h * _M & _MASK
    h ^= h >> 15
    return h


# Outboxes repeat keys (an order's events, an account's updates): a hit costs a dict look-up,
# a miss about a microsecond per ten characters.
@functools.lru_cache(maxsize=65536)
def key_hash(key: str) -> int:
    """The non-negative 31-bit hash stored in ``kafka_key_hash`` for a record with this key."""
    return murmur2(key.encode("utf-8")) & 0x7FFFFFFF


def shard_of(key: str, shards: int) -> int:
    """The shard, among ``shards``, that harvests records with this key."""
    if shards < 1:
        raise ValueError(f"shards must be at least 1, got {shards}")
    return key_hash(key) % shards
