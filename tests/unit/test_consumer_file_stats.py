"""Which columns of a new lake table keep Delta file statistics (spark_consumer.file_stats)."""

from __future__ import annotations

import pytest
from pyspark.sql.types import (
    ArrayType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from spark_consumer.file_stats import INDEXED_BY_DEFAULT, leaves, stats_columns

pytestmark = pytest.mark.unit


def _schema(*fields: tuple[str, object]) -> StructType:
    return StructType([StructField(name, t, True) for name, t in fields])  # type: ignore[arg-type]


def _wide(n: int, last: str) -> StructType:
    return _schema(*[(f"c{i}", StringType()) for i in range(n)], (last, LongType()))


def test_a_pruning_column_among_the_first_32_leaves_keeps_delta_s_default() -> None:
    assert stats_columns(_wide(31, "id"), "id") is None  # the 32nd leaf


def test_a_pruning_column_past_them_is_listed_first_with_the_first_others() -> None:
    got = stats_columns(_wide(40, "id"), "id")
    assert got is not None
    names = got.split(",")
    assert names[0] == "id"
    assert names[1:] == [f"c{i}" for i in range(INDEXED_BY_DEFAULT - 1)]


def test_struct_fields_count_one_leaf_each_and_arrays_one() -> None:
    nested = StructType(
        [
            StructField("a", LongType()),
            StructField("b", _schema(("x", LongType()), ("y", LongType()))),
        ]
    )
    assert leaves(nested) == 3
    assert leaves(ArrayType(nested)) == 1
    # 11 structs of 3 leaves: the key is only the 12th column, but its 34th leaf.
    schema = _schema(*[(f"s{i}", nested) for i in range(11)], ("id", LongType()))
    assert stats_columns(schema, "id") == ",".join(["id", *[f"s{i}" for i in range(11)]])
    ten = _schema(*[(f"s{i}", nested) for i in range(10)], ("id", LongType()))
    assert stats_columns(ten, "id") is None  # its 31st leaf


def test_a_table_without_a_key_prunes_by_commit_lsn_after_its_columns() -> None:
    schema = _schema(
        *[(f"c{i}", StringType()) for i in range(33)],
        ("_commit_lsn", LongType()),
        ("_total_order", LongType()),
    )
    got = stats_columns(schema, "_commit_lsn")
    assert got is not None and got.split(",")[0] == "_commit_lsn"


def test_an_unknown_pruning_column_is_a_bug() -> None:
    with pytest.raises(ValueError, match="'nope'"):
        stats_columns(_wide(3, "id"), "nope")


def test_several_pruning_columns_come_first_when_one_is_past_the_default() -> None:
    """A history table prunes by its first key column and its validity columns, which come
    after the source's columns."""
    schema = StructType(
        [StructField(f"c{i}", LongType()) for i in range(40)]
        + [StructField("from", LongType()), StructField("to", LongType())]
    )
    got = stats_columns(schema, "c0", "from", "to")
    assert got is not None
    assert got.split(",")[:3] == ["c0", "from", "to"]
    assert len(got.split(",")) == INDEXED_BY_DEFAULT
    narrow = StructType([StructField(n, LongType()) for n in ("id", "v", "from", "to")])
    assert stats_columns(narrow, "id", "from", "to") is None
