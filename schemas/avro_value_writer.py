"""Avro binary writers for converted values, built once per schema: what fastavro's
``schemaless_writer`` writes for a value of that schema, without walking the schema per value.

The compiled row encoders (``schemas.row_encoder``) use them for the columns they have no
inlined fast path for; unit tests compare each with fastavro's bytes.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any, Final

from schemas.avro_binary import bytes_bytes, long_bytes, string_bytes
from schemas.type_mapping import AvroType

ValueWriter = Callable[[Any], bytes]


class UnsupportedSchema(Exception):
    """An Avro shape this module does not encode: the caller keeps the fastavro path."""


_pack_float: Final = struct.Struct("<f").pack
_pack_double: Final = struct.Struct("<d").pack

_NAMED_KINDS: Final = ("record", "enum", "fixed")
# Logical types whose converters hand over the plain base-type value (int, bytes, str).
_PASS_THROUGH_LOGICAL: Final = {
    "decimal": "bytes",
    "date": "int",
    "time-micros": "long",
    "timestamp-micros": "long",
    "local-timestamp-micros": "long",
    "uuid": "string",
}


def _null(datum: Any) -> bytes:
    return b""


def _boolean(datum: Any) -> bytes:
    return b"\x01" if datum else b"\x00"


def _float(datum: Any) -> bytes:
    return _pack_float(datum)


def _double(datum: Any) -> bytes:
    return _pack_double(datum)


_PRIMITIVES: Final[dict[str, ValueWriter]] = {
    "null": _null,
    "boolean": _boolean,
    "int": long_bytes,
    "long": long_bytes,
    "float": _float,
    "double": _double,
    "bytes": bytes_bytes,
    "string": string_bytes,
}

# Which union branch a Python value takes, by base type (fastavro picks the first branch the
# value validates against; these are the only pairs our converters produce).
_ACCEPTS: Final[dict[type, tuple[str, ...]]] = {
    bool: ("boolean",),
    int: ("int", "long"),
    float: ("double", "float"),
    str: ("string",),
    bytes: ("bytes",),
    dict: ("record", "map"),
    list: ("array",),
}


def base_type(avro: AvroType, named: dict[str, Any]) -> str:
    """The type name fastavro matches a value (and a branch name) against."""
    if isinstance(avro, str):
        return "record" if avro in named else avro
    if isinstance(avro, dict):
        kind: str = avro["type"]
        return kind
    raise UnsupportedSchema(f"nested union {avro!r}")


def _branch_name(avro: AvroType) -> str:
    """The name of a union branch in fastavro's ``(name, datum)`` notation."""
    if isinstance(avro, str):
        return avro
    if avro["type"] in _NAMED_KINDS:
        name: str = avro["name"]
        return name
    base: str = avro["type"]
    return base


def value_writer(avro: AvroType, named: dict[str, ValueWriter]) -> ValueWriter:
    """A function writing a converted value of ``avro`` as fastavro does.

    ``named`` maps full names to writers of the named types defined so far (walk a schema in
    order: Avro defines a name before any reference to it). Full names only: our schemas never
    use names relative to an enclosing namespace.
    """
    if isinstance(avro, str):
        primitive = _PRIMITIVES.get(avro)
        if primitive is not None:
            return primitive
        writer = named.get(avro)
        if writer is None:
            raise UnsupportedSchema(f"unknown named type {avro!r}")
        return writer
    if isinstance(avro, list):
        return _union_writer(avro, named)
    kind = avro["type"]
    if kind == "record":
        return _record_writer(avro, named)
    if kind == "array":
        return _array_writer(value_writer(avro["items"], named))
    if kind == "map":
        return _map_writer(value_writer(avro["values"], named))
    if isinstance(kind, str) and kind in _PRIMITIVES:
        logical = avro.get("logicalType")
        if logical is not None and _PASS_THROUGH_LOGICAL.get(logical) != kind:
            raise UnsupportedSchema(f"logical type {logical!r} on {kind!r}")
        return _PRIMITIVES[kind]
    raise UnsupportedSchema(f"Avro type {kind!r}")


def _record_writer(avro: dict[str, Any], named: dict[str, ValueWriter]) -> ValueWriter:
    fields: list[tuple[str, ValueWriter, Any]] = []

    def write_record(datum: Any) -> bytes:
        # Like fastavro: a missing field is written as its default.
        return b"".join([w(datum.get(name, default)) for name, w, default in fields])

    named[avro["name"]] = write_record  # before the fields: a field may refer to it
    for field in avro["fields"]:
        fields.append((field["name"], value_writer(field["type"], named), field.get("default")))
    return write_record


def _array_writer(item: ValueWriter) -> ValueWriter:
    def write_array(datum: Any) -> bytes:
        if not datum:
            return b"\x00"
        parts = [long_bytes(len(datum))]
        parts.extend(map(item, datum))
        parts.append(b"\x00")  # the zero-length block that ends an array
        return b"".join(parts)

    return write_array


def _map_writer(values: ValueWriter) -> ValueWriter:
    def write_map(datum: Any) -> bytes:
        if not datum:
            return b"\x00"
        parts = [long_bytes(len(datum))]
        for key, value in datum.items():
            parts.append(string_bytes(key))
            parts.append(values(value))
        parts.append(b"\x00")
        return b"".join(parts)

    return write_map


def _union_writer(branches: list[Any], named: dict[str, ValueWriter]) -> ValueWriter:
    writers = [value_writer(b, named) for b in branches]
    heads = [long_bytes(i) for i in range(len(branches))]
    by_name = {_branch_name(b): i for i, b in reversed(list(enumerate(branches)))}
    bases = [base_type(b, named) for b in branches]
    by_type: dict[type, int] = {}
    for pytype, accepted in _ACCEPTS.items():
        matches = [i for i, base in enumerate(bases) if base in accepted]
        if pytype is dict and len(matches) > 1:
            raise UnsupportedSchema("a union of several records/maps")  # fastavro scores fields
        if pytype is float and matches:
            # fastavro prefers double over float whatever their order (no precision loss).
            doubles = [i for i in matches if bases[i] == "double"]
            matches = doubles or matches
        if matches:
            by_type[pytype] = matches[0]
    null_index = bases.index("null") if "null" in bases else None

    def write_union(datum: Any) -> bytes:
        if datum is None:
            if null_index is None:
                raise ValueError("None for a union without null")
            return heads[null_index]
        if type(datum) is tuple:  # fastavro's (branch name, value) notation
            name, datum = datum
            index = by_name.get(name)
            if index is None:
                raise ValueError(f"union branch {name!r} not in {branches!r}")
        else:
            index = by_type.get(type(datum), -1)
            if index < 0:
                raise ValueError(f"{type(datum).__name__} fits no branch of {branches!r}")
        return heads[index] + writers[index](datum)

    return write_union
