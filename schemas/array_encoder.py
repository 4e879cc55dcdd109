"""Arrays of text-like or integer elements: pgoutput wire bytes -> Avro bytes of the array
column, without building the Python list or ``{dims, lower_bounds, elements}`` dict first.

An array column (``schemas.type_mapping``) is ``["null", array<["null", element]>, record
{dims, lower_bounds, elements}]``: a one-dimensional array from index 1 (or the empty array)
is branch 1, a plain Avro array; any other shape is branch 2, the record. These writers follow
``schemas.pg_containers.array_text``/``array_binary`` exactly (same splitting, same cases):
the text writer takes one-dimensional arrays without bounds decoration and hands anything
else to ``slow`` (the converter + generic writer). Unit tests compare both with fastavro on
the converted values.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from schemas.avro_binary import SMALL_LONGS, long_bytes
from schemas.pg_containers import split_array_send, split_flat

Writer = Callable[[bytes], bytes]

_ELEMENT_HEADS: Final = tuple(b"\x02" + long_bytes(n) for n in range(8192))  # branch 1 + length
_EMPTY_ARRAY: Final = b"\x02\x00"  # branch 1, an empty array
_PLAIN: Final = b"\x02"  # branch 1: the plain array
_SHAPED: Final = b"\x04"  # branch 2: the {dims, lower_bounds, elements} record


def text_elements(items: list[bytes | None]) -> list[bytes]:
    """Avro of ``["null", string]`` elements from raw UTF-8 items (None = NULL)."""
    parts: list[bytes] = []
    a = parts.append
    heads = _ELEMENT_HEADS
    for item in items:
        if item is None:
            a(b"\x00")
            continue
        if not item.isascii():
            item.decode()  # the reference decodes: invalid UTF-8 must fail the same way
        n = len(item)
        a((heads[n] if n < 8192 else b"\x02" + long_bytes(n)) + item)
    return parts


def int_text_elements(items: list[bytes | None]) -> list[bytes]:
    """Avro of ``["null", int|long]`` elements from decimal text items."""
    return [b"\x00" if item is None else b"\x02" + long_bytes(int(item)) for item in items]


def array_text_writer(
    delimiter: bytes, elements: Callable[[list[bytes | None]], list[bytes]], slow: Writer
) -> Writer:
    text_items = elements is text_elements
    heads = _ELEMENT_HEADS

    def write(data: bytes) -> bytes:
        if data[:1] != b"{":
            return slow(data)  # bounds decoration, e.g. '[0:2]={1,2,3}'
        if data == b"{}":
            return _EMPTY_ARRAY
        raw: list[bytes | None]
        # No '"' (34), no '\\' (92), one '{' (123). Integer needles: ``b'"' in data`` goes
        # through the buffer protocol and costs ten times a byte's memchr.
        if 34 not in data and 92 not in data and data.count(123) == 1:
            if text_items:
                # The common case in one pass. The items are the text between ASCII
                # delimiters, so the whole text is valid UTF-8 exactly when every item is.
                if not data.isascii():
                    data.decode()
                items = data[1:-1].split(delimiter)
                if len(data) < 8192 and b"NULL" not in items:  # every item shorter too
                    parts = [heads[len(item)] + item for item in items]
                else:
                    parts = [
                        b"\x00"
                        if item == b"NULL"
                        else (
                            heads[len(item)]
                            if len(item) < 8192
                            else b"\x02" + long_bytes(len(item))
                        )
                        + item
                        for item in items
                    ]
                n = len(parts)
                count = SMALL_LONGS[n] if n < 8192 else long_bytes(n)
                return b"".join((_PLAIN, count, *parts, b"\x00"))
            raw = [None if item == b"NULL" else item for item in data[1:-1].split(delimiter)]
        elif data[1:2] != b"{":  # one dimension with quoted items
            raw = split_flat(data[1:-1], delimiter)
        else:
            return slow(data)  # several dimensions
        n = len(raw)
        count = SMALL_LONGS[n] if n < 8192 else long_bytes(n)
        return b"".join((_PLAIN, count, *elements(raw), b"\x00"))

    return write


def _int_array(values: list[int]) -> bytes:
    if not values:
        return b"\x00"
    return long_bytes(len(values)) + b"".join(map(long_bytes, values)) + b"\x00"


def array_binary_writer(
    elements: Callable[[list[bytes | None]], list[bytes]],
) -> Writer:
    """array_send bytes (split as ``pg_containers.array_binary`` does) -> Avro bytes."""

    def write(data: bytes) -> bytes:
        dims, lower, raw = split_array_send(data)
        if len(dims) <= 1 and lower in ([], [1]):
            parts = [_PLAIN]
        else:
            parts = [_SHAPED, _int_array(dims), _int_array(lower)]
        if raw:
            parts.append(long_bytes(len(raw)))
            parts.extend(elements(raw))
        parts.append(b"\x00")
        return b"".join(parts)

    return write


def int_binary_elements(unpack: Callable[[bytes], tuple[int]]) -> Callable[..., list[bytes]]:
    """Avro of ``["null", int|long]`` elements from binary integers (``unpack``: struct's)."""

    def elements(items: list[bytes | None]) -> list[bytes]:
        return [
            b"\x00" if item is None else b"\x02" + long_bytes(unpack(item)[0]) for item in items
        ]

    return elements
