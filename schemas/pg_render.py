"""Binary wire values -> PostgreSQL's own text, for types kept as Avro strings.

In binary mode pgoutput sends these types in their ``*send`` format, and psycopg has no
loader that yields PostgreSQL's text for them (it loads tsvector/bit/geometry/money as raw
bytes, inet as ``ipaddress`` objects). So each renderer here is hand-written from the
type's ``*send``/``*out`` functions in the PostgreSQL sources, so that text and binary mode
produce the same Avro string.
"""

from __future__ import annotations

import ipaddress
import struct
from collections.abc import Callable
from typing import Final

from schemas.pg_datetime import render_date, render_timestamp
from schemas.pg_scalars import numeric_unbounded_binary

_F8: Final = struct.Struct("!d")
_I32: Final = struct.Struct("!i")
_U16: Final = struct.Struct("!H")
_I16: Final = struct.Struct("!h")


def float8_text(x: float) -> str:
    """float8out with extra_float_digits >= 1: shortest round-trip digits.

    Python's repr gives the same digits; PostgreSQL differs only in spelling (no '.0',
    'Infinity'/'NaN', and exponent notation from 1e15 instead of 1e16).
    """
    if x != x:
        return "NaN"
    if x in (float("inf"), float("-inf")):
        return "Infinity" if x > 0 else "-Infinity"
    text = repr(x)
    if "e" in text:
        return text
    if text.endswith(".0"):
        text = text[:-2]
    if abs(x) >= 1e15:  # 1e15 <= |x| < 1e16: repr is positional here, PostgreSQL is not
        sign = "-" if text.startswith("-") else ""
        digits = text.lstrip("-")
        mantissa = digits.rstrip("0")
        exponent = len(digits) - 1
        body = mantissa[0] + ("." + mantissa[1:] if len(mantissa) > 1 else "")
        return f"{sign}{body}e+{exponent:02d}"
    return text


def _floats(data: bytes, count: int, offset: int = 0) -> list[str]:
    return [float8_text(_F8.unpack_from(data, offset + 8 * i)[0]) for i in range(count)]


def _points(data: bytes, npts: int, offset: int) -> str:
    xy = _floats(data, 2 * npts, offset)
    return ",".join(f"({xy[2 * i]},{xy[2 * i + 1]})" for i in range(npts))


def point_binary(data: bytes) -> str:
    return "(" + ",".join(_floats(data, 2)) + ")"


def line_binary(data: bytes) -> str:
    return "{" + ",".join(_floats(data, 3)) + "}"


def lseg_binary(data: bytes) -> str:
    return "[" + _points(data, 2, 0) + "]"


def box_binary(data: bytes) -> str:
    return _points(data, 2, 0)


def path_binary(data: bytes) -> str:
    closed = data[0] != 0
    (npts,) = _I32.unpack_from(data, 1)
    points = _points(data, npts, 5)
    return f"({points})" if closed else f"[{points}]"


def polygon_binary(data: bytes) -> str:
    (npts,) = _I32.unpack_from(data, 0)
    return "(" + _points(data, npts, 4) + ")"


def circle_binary(data: bytes) -> str:
    x, y, r = _floats(data, 3)
    return f"<({x},{y}),{r}>"


# --- network, bits, lsn --------------------------------------------------------------------

_PGSQL_AF_INET: Final = 2  # AF_INET + 0 in PostgreSQL's inet send format
_PGSQL_AF_INET6: Final = 3


def _inet_parts(data: bytes) -> tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, int, int]:
    family, bits, _is_cidr, nbytes = data[0], data[1], data[2], data[3]
    addr = data[4 : 4 + nbytes]
    if family == _PGSQL_AF_INET:
        return ipaddress.IPv4Address(addr), bits, 32
    if family == _PGSQL_AF_INET6:
        return ipaddress.IPv6Address(addr), bits, 128
    raise ValueError(f"unknown inet family {family}")


def inet_binary(data: bytes) -> str:
    address, bits, max_bits = _inet_parts(data)
    return str(address) if bits == max_bits else f"{address}/{bits}"


def cidr_binary(data: bytes) -> str:
    address, bits, _ = _inet_parts(data)
    return f"{address}/{bits}"


def macaddr_binary(data: bytes) -> str:
    return ":".join(f"{b:02x}" for b in data)


def bits_binary(data: bytes) -> str:
    (nbits,) = _I32.unpack_from(data, 0)
    if nbits == 0:
        return ""
    body = data[4:]
    return format(int.from_bytes(body, "big"), f"0{len(body) * 8}b")[:nbits]


def pg_lsn_binary(data: bytes) -> str:
    (lsn,) = struct.unpack("!Q", data)
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


# --- text search ---------------------------------------------------------------------------


def _ts_quote(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "''") + "'"


def tsvector_binary(data: bytes) -> str:
    (count,) = _I32.unpack_from(data, 0)
    pos = 4
    out: list[str] = []
    for _ in range(count):
        end = data.index(b"\x00", pos)
        lexeme = _ts_quote(data[pos:end].decode())
        (npos,) = _U16.unpack_from(data, end + 1)
        pos = end + 3
        if npos:
            marks = []
            for _ in range(npos):
                (wp,) = _U16.unpack_from(data, pos)
                pos += 2
                weight = "DCBA"[wp >> 14]
                marks.append(f"{wp & 0x3FFF}{'' if weight == 'D' else weight}")
            lexeme += ":" + ",".join(marks)
        out.append(lexeme)
    return " ".join(out)


_QI_VAL: Final = 1
_OP_NOT, _OP_AND, _OP_OR, _OP_PHRASE = 1, 2, 3, 4
_PRIORITY: Final = {_OP_NOT: 4, _OP_AND: 2, _OP_OR: 1, _OP_PHRASE: 3}  # tsearch_op_priority

# A parsed tsquery item: ("val", text) or ("op", oper, distance).
_Item = tuple[int, int, int, str]  # (kind, oper, distance, rendered operand)


def _parse_tsquery_items(data: bytes) -> list[_Item]:
    (count,) = _I32.unpack_from(data, 0)
    pos = 4
    items: list[_Item] = []
    for _ in range(count):
        kind = data[pos]
        if kind == _QI_VAL:
            weight, prefix = data[pos + 1], data[pos + 2]
            end = data.index(b"\x00", pos + 3)
            text = _ts_quote(data[pos + 3 : end].decode())
            if prefix or weight:
                text += ":" + ("*" if prefix else "")
                text += "".join(
                    letter
                    for bit, letter in ((8, "A"), (4, "B"), (2, "C"), (1, "D"))
                    if weight & bit
                )
            items.append((kind, 0, 0, text))
            pos = end + 1
        else:
            oper = data[pos + 1]
            distance = 0
            pos += 2
            if oper == _OP_PHRASE:
                (distance,) = _I16.unpack_from(data, pos)
                pos += 2
            items.append((kind, oper, distance, ""))
    return items


def tsquery_binary(data: bytes) -> str:
    """Re-creates tsquery.c's infix(): items come operator first, then right, then left operand."""
    items = _parse_tsquery_items(data)
    cursor = 0

    def infix(parent_priority: int, right_phrase_op: bool) -> str:
        nonlocal cursor
        kind, oper, distance, text = items[cursor]
        cursor += 1
        if kind == _QI_VAL:
            return text
        priority = _PRIORITY[oper]
        if oper == _OP_NOT:
            body = "!" + infix(priority, False)
            return f"( {body} )" if priority < parent_priority else body
        parens = priority < parent_priority or (oper == _OP_PHRASE and right_phrase_op)
        right = infix(priority, oper == _OP_PHRASE)
        left = infix(priority, False)
        if oper == _OP_AND:
            symbol = "&"
        elif oper == _OP_OR:
            symbol = "|"
        else:
            symbol = "<->" if distance == 1 else f"<{distance}>"
        body = f"{left} {symbol} {right}"
        return f"( {body} )" if parens else body

    if not items:
        return ""
    return infix(-1, False)


# --- ranges --------------------------------------------------------------------------------

_RANGE_EMPTY, _RANGE_LB_INC, _RANGE_UB_INC, _RANGE_LB_INF, _RANGE_UB_INF = 1, 2, 4, 8, 16
_RANGE_SPECIAL: Final = frozenset('"\\()[],')


def _range_bound(text: str) -> str:
    """range_bound_escape(): quote when empty or holding a delimiter or space."""
    if text and not any(ch in _RANGE_SPECIAL or ch.isspace() for ch in text):
        return text
    return '"' + text.replace("\\", "\\\\").replace('"', '""') + '"'


def range_binary(element_text: Callable[[bytes], str]) -> Callable[[bytes], str]:
    """A range's binary form -> its text, rendering each bound with ``element_text``."""

    def convert(data: bytes) -> str:
        flags = data[0]
        if flags & _RANGE_EMPTY:
            return "empty"
        pos = 1
        bounds: list[str] = []
        for infinite in (flags & _RANGE_LB_INF, flags & _RANGE_UB_INF):
            if infinite:
                bounds.append("")
                continue
            (length,) = _I32.unpack_from(data, pos)
            bounds.append(_range_bound(element_text(data[pos + 4 : pos + 4 + length])))
            pos += 4 + length
        opening = "[" if flags & _RANGE_LB_INC else "("
        closing = "]" if flags & _RANGE_UB_INC else ")"
        return f"{opening}{bounds[0]},{bounds[1]}{closing}"

    return convert


def _int_text(fmt: str) -> Callable[[bytes], str]:
    unpack = struct.Struct(fmt).unpack

    def render(data: bytes) -> str:
        return str(unpack(data)[0])

    return render


# Binary -> text of the subtypes of the built-in range types.
RANGE_ELEMENT_TEXT: Final[dict[str, Callable[[bytes], str]]] = {
    "int4": _int_text("!i"),
    "int8": _int_text("!q"),
    "numeric": numeric_unbounded_binary,
    "date": lambda data: render_date(_I32.unpack(data)[0]),
    "timestamp": lambda data: render_timestamp(struct.unpack("!q", data)[0], with_tz=False),
    "timestamptz": lambda data: render_timestamp(struct.unpack("!q", data)[0], with_tz=True),
}
