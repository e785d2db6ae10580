"""The row → shard function: Kafka's own key hash, so any language's writer can compute it."""

from __future__ import annotations

import pytest

from pyharvest.core.outbox.keys import key_hash, murmur2, shard_of

# Apache Kafka's UtilsTest.testMurmur2 (signed 32-bit values in Java).
KAFKA_VECTORS = {
    "21": -973932308,
    "foobar": -790332482,
    "a-little-bit-long-string": -985981536,
    "a-little-bit-longer-string": -1486304829,
    "lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
    "abc": 479470107,
}


@pytest.mark.parametrize(("key", "signed"), KAFKA_VECTORS.items())
def test_murmur2_is_kafkas(key: str, signed: int) -> None:
    assert murmur2(key.encode()) == signed & 0xFFFFFFFF


@pytest.mark.parametrize(("key", "signed"), KAFKA_VECTORS.items())
def test_key_hash_is_kafkas_to_positive(key: str, signed: int) -> None:
    assert key_hash(key) == signed & 0x7FFFFFFF
    assert 0 <= key_hash(key) < 2**31


def test_shard_is_the_partition_kafkas_default_partitioner_picks() -> None:
    assert shard_of("21", 6) == (-973932308 & 0x7FFFFFFF) % 6
    assert {shard_of(f"user-{i}", 4) for i in range(100)} == {0, 1, 2, 3}


def test_non_ascii_keys_hash_their_utf8_bytes() -> None:
    assert key_hash("clé") == murmur2("clé".encode()) & 0x7FFFFFFF != murmur2("clé".encode("latin-1")) & 0x7FFFFFFF


def test_shards_must_be_positive() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        shard_of("k", 0)
