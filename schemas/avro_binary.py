"""Avro binary primitives (zig-zag varints, length-prefixed strings), for the hand-written
encoders on the producer's hot path (``schemas.row_encoder``, ``producer.envelope_writer``).

Hand-written because fastavro keeps its primitive writers private (Cython ``cdef``), and
calling its public ``schemaless_writer`` per value costs a schema traversal each time. The
varint is assembled from two lookup tables of 14-bit groups instead of a loop per 7 bits:
row ids, lengths and LSNs then take one to three table lookups. Unit tests compare every
function here with fastavro's output.
"""

from __future__ import annotations

from typing import Final

_LONG_MIN: Final = -(2**63)
_LONG_MAX: Final = 2**63 - 1


def _varint_slow(n: int) -> bytes:
    """Unsigned base-128 varint, little-endian groups (the reference for the tables)."""
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


# VARINT_LAST[n]: the varint of n < 2**14 (1 or 2 bytes); VARINT_MID[n]: 14 bits as two groups
# that both carry the continuation bit (a varint's middle part). Public: the generated row
# encoders and the envelope writer's hot path inline varints with them.
VARINT_LAST: Final = tuple(_varint_slow(n) for n in range(1 << 14))
VARINT_MID: Final = tuple(bytes(((n & 0x7F) | 0x80, (n >> 7) | 0x80)) for n in range(1 << 14))


def varint(n: int) -> bytes:
    """Unsigned varint of 0 <= n < 2**64 (at most five table lookups, no loop)."""
    if n < 0x4000:
        return VARINT_LAST[n]
    if n < 0x10000000:
        return VARINT_MID[n & 0x3FFF] + VARINT_LAST[n >> 14]
    if n < 0x40000000000:
        return VARINT_MID[n & 0x3FFF] + VARINT_MID[(n >> 14) & 0x3FFF] + VARINT_LAST[n >> 28]
    if n < 0x100000000000000:  # e.g. timestamps in microseconds
        return (
            VARINT_MID[n & 0x3FFF] + VARINT_MID[(n >> 14) & 0x3FFF] + VARINT_MID[(n >> 28) & 0x3FFF]
            + VARINT_LAST[n >> 42]
        )  # fmt: skip
    if n >> 64:
        raise OverflowError(f"{n} does not fit an Avro long")
    return (
        VARINT_MID[n & 0x3FFF] + VARINT_MID[(n >> 14) & 0x3FFF] + VARINT_MID[(n >> 28) & 0x3FFF]
        + VARINT_MID[(n >> 42) & 0x3FFF] + VARINT_LAST[n >> 56]
    )  # fmt: skip


def long_bytes(value: int) -> bytes:
    """Avro ``int``/``long``: zig-zag, then varint (inlined up to 2**42: this runs for every
    LSN, length and integer column of every event)."""
    if 0 <= value < 0x2000:
        return VARINT_LAST[value << 1]
    if _LONG_MIN <= value <= _LONG_MAX:
        n = (value << 1) ^ (value >> 63)
        if n < 0x4000:  # small negative values
            return VARINT_LAST[n]
        if n < 0x10000000:
            return VARINT_MID[n & 0x3FFF] + VARINT_LAST[n >> 14]
        if n < 0x40000000000:
            return VARINT_MID[n & 0x3FFF] + VARINT_MID[(n >> 14) & 0x3FFF] + VARINT_LAST[n >> 28]
        return varint(n)
    raise OverflowError(f"{value} does not fit an Avro long")


# long_bytes(n) for 0 <= n < 8192, for lengths and positions looked up without a call.
SMALL_LONGS: Final = tuple(VARINT_LAST[n << 1] for n in range(0x2000))


def string_bytes(text: str) -> bytes:
    """Avro ``string``: byte length (a long), then UTF-8."""
    data = text.encode()
    return long_bytes(len(data)) + data


def bytes_bytes(data: bytes) -> bytes:
    """Avro ``bytes``: length (a long), then the bytes."""
    return long_bytes(len(data)) + data


def branch_bytes(index: int) -> bytes:
    """A union branch index (a zig-zag long)."""
    return long_bytes(index)
