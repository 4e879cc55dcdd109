"""Scalar values (numbers, text, bytes, documents): pgoutput text/binary -> Avro-ready Python.

Every function takes the raw column bytes and returns what fastavro writes without further
preparation (ints, floats, str, bytes, or ``("string", text)`` for a union's string branch).
psycopg's loaders are used where they are exact; the hand-written parts say why.
"""

from __future__ import annotations

import binascii
import struct
import uuid
from collections.abc import Callable
from decimal import Decimal
from typing import Final

from psycopg.adapt import Transformer
from psycopg.postgres import types as builtin_types
from psycopg.pq import Format

_TX: Final = Transformer()
_load_numeric_binary = _TX.get_loader(builtin_types["numeric"].oid, Format.BINARY).load

# Text forms of the non-finite numerics (also refused by the compiled encoders' inlined path).
NUMERIC_SPECIALS: Final = {b"NaN": "NaN", b"Infinity": "Infinity", b"-Infinity": "-Infinity"}


def bool_text(data: bytes) -> bool:
    if data == b"t":
        return True
    if data == b"f":
        return False
    raise ValueError("boolean text is neither 't' nor 'f'")


def bool_binary(data: bytes) -> bool:
    return data != b"\x00"


def _unpacker(fmt: str) -> Callable[[bytes], int | float]:
    unpack = struct.Struct(fmt).unpack

    def convert(data: bytes) -> int | float:
        value: int | float = unpack(data)[0]
        return value

    return convert


int2_binary: Final = _unpacker("!h")
int4_binary: Final = _unpacker("!i")
int8_binary: Final = _unpacker("!q")
oid_binary: Final = _unpacker("!I")
float4_binary: Final = _unpacker("!f")
float8_binary: Final = _unpacker("!d")
int_text: Final[Callable[[bytes], int]] = int  # int() parses ASCII digits straight from bytes
float_text: Final[Callable[[bytes], float]] = float  # also 'NaN', 'Infinity', '-Infinity'


def decode_text(data: bytes) -> str:
    """Text-like values: the bytes are already UTF-8 (database encoding UTF8 is required)."""
    return data.decode()


def bytea_text(data: bytes) -> bytes:
    if data[:2] != b"\\x":
        raise ValueError("bytea text is not in hex format (set bytea_output = 'hex')")
    return binascii.unhexlify(data[2:])


def raw_bytes(data: bytes) -> bytes:
    return data


def uuid_binary(data: bytes) -> str:
    return str(uuid.UUID(bytes=data))


def jsonb_binary(data: bytes) -> str:
    if data[:1] != b"\x01":
        raise ValueError(f"unknown jsonb binary version {data[:1]!r}")
    return data[1:].decode()


# --- numeric -------------------------------------------------------------------------------


def _unscaled_bytes(unscaled: int) -> bytes:
    """Avro decimal's body: the unscaled integer, big-endian two's complement, minimal length.

    Given to fastavro pre-encoded: its own Decimal path costs more than this.
    """
    return unscaled.to_bytes(unscaled.bit_length() // 8 + 1, "big", signed=True)


def _decimal_unscaled(value: Decimal, scale: int) -> int:
    """The integer ``value * 10**scale``, exactly (no Decimal context rounding)."""
    sign, digits, exponent = value.as_tuple()
    if not isinstance(exponent, int):  # 'n'/'N'/'F': a NaN or infinity spelt unlike PostgreSQL
        raise ValueError(f"{value} is not a finite number")
    magnitude = int("".join(map(str, digits)) or "0")
    shift = exponent + scale
    if shift >= 0:
        magnitude *= 10**shift
    else:
        magnitude, rest = divmod(magnitude, 10**-shift)
        if rest:
            raise ValueError(f"{value} has more than {scale} fractional digits")
    return -magnitude if sign else magnitude


def numeric_bounded_text(scale: int) -> Callable[[bytes], bytes | tuple[str, str]]:
    """numeric(p,s) text -> Avro decimal bytes; NaN/+-Infinity -> the union's string branch."""

    def convert(data: bytes) -> bytes | tuple[str, str]:
        special = NUMERIC_SPECIALS.get(data)
        if special is not None:
            return ("string", special)
        whole, _, frac = data.partition(b".")
        if len(frac) == scale:
            # PostgreSQL prints exactly `scale` fractional digits for numeric(p,s): fast path.
            return _unscaled_bytes(int(whole + frac))
        return _unscaled_bytes(_decimal_unscaled(Decimal(data.decode()), scale))

    return convert


def numeric_bounded_binary(scale: int) -> Callable[[bytes], bytes | tuple[str, str]]:
    def convert(data: bytes) -> bytes | tuple[str, str]:
        value: Decimal = _load_numeric_binary(data)
        if not value.is_finite():
            return ("string", numeric_canonical(value))
        return _unscaled_bytes(_decimal_unscaled(value, scale))

    return convert


def numeric_canonical(value: Decimal) -> str:
    """PostgreSQL's text for a numeric: plain notation, its display scale kept."""
    if value.is_nan():
        return "NaN"
    if value.is_infinite():
        return "-Infinity" if value.is_signed() else "Infinity"
    return format(value, "f")


def numeric_unbounded_binary(data: bytes) -> str:
    return numeric_canonical(_load_numeric_binary(data))


# --- money ---------------------------------------------------------------------------------


def money_binary(data: bytes) -> str:
    """int8 minor units -> text as PostgreSQL prints it with ``lc_monetary`` C or en_US.

    Hand-written because psycopg has no money loader; the binary form carries no locale, so
    this assumes 2 fractional digits, '$' and ',' grouping (docs/downstream-tools.md).
    """
    (cents,) = struct.unpack("!q", data)
    whole, frac = divmod(abs(cents), 100)
    return f"{'-' if cents < 0 else ''}${whole:,}.{frac:02d}"
