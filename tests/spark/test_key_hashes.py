"""The Spark writer's vectorised key hash equals core.shards.key_hash, key by key."""

from __future__ import annotations

import random

import pyarrow as pa
import pytest

from pyharvest.bindings.spark.key_hashes import key_hashes
from pyharvest.core.outbox.keys import key_hash

pytestmark = pytest.mark.spark


def _keys(n: int, seed: int = 7) -> list[str]:
    rnd = random.Random(seed)
    alphabet = "abcXYZ019-_ é€😀"
    lengths = [1, 2, 3, 4, 5, 7, 8, 13, 36, 200]
    return ["".join(rnd.choice(alphabet) for _ in range(rnd.choice(lengths))) for _ in range(n)]


def test_every_key_hashes_as_the_stasher_hashes_it() -> None:
    keys = _keys(4000) + [str(i) for i in range(3000)] + ["only-one-of-this-length-" * 3]
    assert key_hashes(pa.array(keys)).to_pylist() == [key_hash(k) for k in keys]


@pytest.mark.parametrize("make", [
    lambda keys: pa.array(keys).slice(100, 1500),
    lambda keys: pa.chunked_array([keys[:7], keys[7:1600]], pa.large_string()),
    lambda keys: pa.array([k.encode() for k in keys], pa.binary()).slice(100, 1500),
], ids=["sliced", "chunked-large", "binary"])
def test_arrow_layouts(make) -> None:  # noqa: ANN001
    keys = _keys(1600, seed=3)
    arr = make(keys)
    expected = keys[100:1600] if len(arr) == 1500 else keys
    assert key_hashes(arr).to_pylist() == [key_hash(k) for k in expected]


def test_one_length_and_empty_inputs() -> None:
    keys = [f"order-{i:06d}" for i in range(500)]
    assert key_hashes(pa.array(keys)).to_pylist() == [key_hash(k) for k in keys]
    assert key_hashes(pa.array([], pa.string())).to_pylist() == []
    with pytest.raises(ValueError, match="null"):
        key_hashes(pa.array(["a", None]))
