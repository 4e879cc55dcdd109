"""The compiled COPY text twin of the row + key encoders (``row_encoder.copy_encoder``): for
every mapped type's edge values, in rows with NULLs and COPY escapes, it gives the bytes of
the careful path (COPY text -> pgoutput values -> the compiled encoder), or gives up."""

from __future__ import annotations

import random

import pytest

from producer.pgoutput import Column, Relation
from producer.snapshot.copy_text import fields, tuple_data
from schemas import row_encoder
from schemas.relation import RelationCodec, build_relation_codec
from schemas.type_catalog import TypeCatalog
from tests.unit.test_schemas_convert import CASES

_ESCAPES = {
    ord("\\"): b"\\\\",
    ord("\n"): b"\\n",
    ord("\r"): b"\\r",
    ord("\t"): b"\\t",
    ord("\b"): b"\\b",
    ord("\f"): b"\\f",
    ord("\v"): b"\\v",
}


def copy_escape(value: bytes | None) -> bytes:
    """A value as COPY TO writes it in its text format (independent of copy_text)."""
    if value is None:
        return b"\\N"
    return b"".join(_ESCAPES.get(b, bytes([b])) for b in value)


def _codec(keyed: bool) -> tuple[RelationCodec, list[bytes]]:
    labels = sorted(CASES)
    columns = (
        Column(1 if keyed else 0, "id", 20, -1, keyed),
        *(Column(0, f"c{i}", CASES[k][0], CASES[k][1], False) for i, k in enumerate(labels)),
    )
    relation = Relation(None, 1, "public", "t", "d" if keyed else "n", columns)
    return build_relation_codec(relation, TypeCatalog(), "db.public.t"), [
        CASES[k][2] for k in labels
    ]


def _twin(codec: RelationCodec) -> row_encoder.CopyRowKeyEncoder:
    encoder = codec.encode_row if codec.encode_key is None else codec.encode_row_key
    twin = row_encoder.copy_encoder(encoder, fields)
    assert twin is not None
    return twin


@pytest.mark.parametrize("keyed", [True, False])
def test_copy_twin_equals_the_careful_path_on_every_edge_value(keyed: bool) -> None:
    codec, texts = _codec(keyed)
    twin = _twin(codec)
    rng = random.Random(7)
    width = len(texts) + 1
    compared = 0
    for i in range(400):
        values: list[bytes | None] = [str(i).encode()]
        for text in texts:
            values.append(None if rng.random() < 0.15 else text)
        if i % 3 == 0:  # a control character or backslash somewhere in a text column
            values[1 + sorted(CASES).index("text empty")] = b"a\\b\tc\nd\re\x08\x0c\x0b\\N"
        line = b"\t".join(copy_escape(v) for v in values)
        row, _toast, key = codec.encode_row_key(tuple_data(line, width))
        fast = twin(line)
        assert fast is not None, line
        assert fast == (row, key)
        compared += 1
    assert compared == 400


def test_copy_twin_gives_up_where_the_careful_path_decides() -> None:
    codec, texts = _codec(True)
    twin = _twin(codec)
    good = b"\t".join([b"1", *(copy_escape(t) for t in texts)])
    assert twin(good) is not None
    assert twin(good + b"\textra") is None  # a field too many
    assert twin(good.rpartition(b"\t")[0]) is None  # one too few
    null_key = b"\\N\t" + good.partition(b"\t")[2]  # as the careful path: a null (never read)
    row, _toast, key = codec.encode_row_key(tuple_data(null_key, len(texts) + 1))
    assert twin(null_key) == (row, key)
    assert twin(b"x\t" + good.partition(b"\t")[2]) is None  # not an int8


def test_copy_twin_is_compiled_once_per_encoder() -> None:
    codec, _ = _codec(True)
    assert row_encoder.copy_encoder(codec.encode_row_key, fields) is _twin(codec)
    assert row_encoder.copy_encoder(lambda values, lsn=None: None, fields) is None
