"""Kafka's key hash (:func:`pyharvest.core.outbox.keys.key_hash`) of a whole Arrow column at once.

The Spark writer stores each record's key hash (``kafka_key_hash``) so that a sharded
harvester finds the record in its key's shard. Hashing a million keys one by one in Python
costs about a second of a task's time; here murmur2 runs as Arrow compute kernels over every
key of one length at a time (a key of ``n`` bytes is ``n // 4`` words and a tail, so keys of
one length go through the same steps): a few dozen kernel calls per distinct key length,
whatever the number of keys. Lengths held by only a few keys are hashed one by one.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from pyharvest.core.outbox.keys import murmur2

__all__ = ["key_hashes"]

_M = pa.scalar(0x5BD1E995, pa.uint32())
_SEED = 0x9747B28C
_POSITIVE = pa.scalar(0x7FFFFFFF, pa.uint32())
# Below this many keys of one length, the kernels' fixed cost exceeds hashing one by one.
_FEW = 64


def _u32(v: int) -> pa.Scalar:
    return pa.scalar(v, pa.uint32())


def key_hashes(keys: pa.Array | pa.ChunkedArray) -> pa.Array:
    """The key hash of each of ``keys`` (string or binary, UTF-8, no nulls), as an int32 array
    in the same order: ``murmur2(utf8(key)) & 0x7fffffff``."""
    if isinstance(keys, pa.ChunkedArray):
        keys = keys.combine_chunks() if keys.num_chunks != 1 else keys.chunk(0)
    if pa.types.is_string(keys.type) or pa.types.is_large_string(keys.type):
        keys = keys.cast(pa.large_binary() if pa.types.is_large_string(keys.type) else pa.binary())
    if keys.null_count:
        raise ValueError("a key is null; only non-null keys have a key hash")
    n = len(keys)
    if n == 0:
        return pa.array([], pa.int32())
    lengths = pc.binary_length(keys)
    distinct = pc.unique(lengths).to_pylist()
    if len(distinct) == 1:
        return _same_length(keys, distinct[0])
    out = pa.nulls(n, pa.int32()).fill_null(0)
    for length in distinct:
        mask = pc.equal(lengths, length)
        out = pc.replace_with_mask(out, mask, _same_length(pc.filter(keys, mask), length))
    return out


def _same_length(keys: pa.Array, length: int) -> pa.Array:
    """The hashes of ``keys``, all ``length`` bytes long."""
    m = len(keys)
    if m < _FEW or length == 0:
        return pa.array([murmur2(k) & 0x7FFFFFFF for k in keys.to_pylist()], pa.int32())
    # The keys' bytes, m rows of ``length``, as a fixed-size list: byte j of every key is one kernel call.
    _validity, offsets, data = keys.buffers()
    offset_type = pa.int64() if pa.types.is_large_binary(keys.type) else pa.int32()
    first = pa.Array.from_buffers(offset_type, 1, [None, offsets], offset=keys.offset)[0].as_py()
    flat = pa.Array.from_buffers(pa.uint8(), m * length, [None, data], offset=first)
    rows = pa.FixedSizeListArray.from_arrays(flat, length)

    def byte(j: int) -> pa.Array:
        return pc.cast(pc.list_element(rows, j), pa.uint32())

    h: pa.Array | pa.Scalar = _u32((_SEED ^ length) & 0xFFFFFFFF)
    end = length - length % 4
    for i in range(0, end, 4):
        k = pc.bit_wise_or(
            pc.bit_wise_or(byte(i), pc.shift_left(byte(i + 1), _u32(8))),
            pc.bit_wise_or(pc.shift_left(byte(i + 2), _u32(16)), pc.shift_left(byte(i + 3), _u32(24))),
        )
        k = pc.multiply(k, _M)  # uint32: wraps, as murmur2's 32-bit arithmetic does
        k = pc.bit_wise_xor(k, pc.shift_right(k, _u32(24)))
        k = pc.multiply(k, _M)
        h = pc.bit_wise_xor(pc.multiply(h, _M), k)
    rest = length - end
    if rest == 3:
        h = pc.bit_wise_xor(h, pc.shift_left(byte(end + 2), _u32(16)))
    if rest >= 2:
        h = pc.bit_wise_xor(h, pc.shift_left(byte(end + 1), _u32(8)))
    if rest >= 1:
        h = pc.multiply(pc.bit_wise_xor(h, byte(end)), _M)
    h = pc.bit_wise_xor(h, pc.shift_right(h, _u32(13)))
    h = pc.multiply(h, _M)
    h = pc.bit_wise_xor(h, pc.shift_right(h, _u32(15)))
    return pc.cast(pc.bit_wise_and(h, _POSITIVE), pa.int32())
