"""The summary's Arrow -> Python conversion (transaction_stats._columns): the fast paths give
exactly what pyarrow's own `to_pylist` gives, nulls and 64-bit values included."""

from __future__ import annotations

import pyarrow as pa
import pytest

from spark_consumer import transaction_stats as ts

pytestmark = pytest.mark.unit

BIG = 2**63 - 1  # an LSN can use all 64 bits; a float on the way would round it


@pytest.mark.parametrize(
    "column",
    [
        pa.array([1, None, BIG, -5, 0], pa.int64()),
        pa.array([1, 2, 3], pa.int32()),
        pa.array([True, None, False], pa.bool_()),
        pa.array([False, True], pa.bool_()),
        pa.array([None, None], pa.int64()),
        pa.array([None, None], pa.list_(pa.string())),
        pa.array([["a", "b"], None, []], pa.list_(pa.string())),
        pa.array(["x", None, "y"], pa.string()),
        pa.array(
            [[{"data_collection": "s.t", "event_count": 3}], None],
            pa.list_(pa.struct([("data_collection", pa.string()), ("event_count", pa.int64())])),
        ),
        pa.array([], pa.int64()),
    ],
)
def test_a_column_converts_as_pyarrow_converts_it(column: pa.Array) -> None:
    assert ts._pylist(column) == column.to_pylist()


def test_repeated_strings_convert_to_one_object_per_value() -> None:
    batch = pa.record_batch(
        {
            "coll": pa.array(["s.a", None, "s.b", "s.a"], pa.string()),
            "tx": pa.array(["7", "7", "8", "8"], pa.string()),
            "lsn": pa.array([10, 10, 20, None], pa.int64()),
        }
    )
    cols = ts._columns(batch)
    assert cols == {
        "coll": ["s.a", None, "s.b", "s.a"],
        "tx": ["7", "7", "8", "8"],
        "lsn": [10, 10, 20, None],
    }
    assert cols["coll"][0] is cols["coll"][3]
    assert cols["tx"][0] is cols["tx"][1]
