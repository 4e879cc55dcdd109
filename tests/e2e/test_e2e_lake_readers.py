"""Other engines read the lake: delta-rs (`deltalake`) and DuckDB's `delta` extension open the
tables the consumer writes with deletion vectors (the default) and without them
(`lake_deletion_vectors` off), after inserts, updates and deletes, and see exactly the rows
PostgreSQL has. The protocol each mode leaves is checked too (docs/lake.md, "Reading the lake with
other engines" lists it), and a consumer started in the other mode on an existing lake stops.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import duckdb
import duckdb_extension_delta
import pyarrow as pa
import pytest
from deltalake import DeltaTable, QueryBuilder
from pyspark.errors import StreamingQueryException
from pyspark.sql import SparkSession

from tests.e2e.harness import Pipeline, pipeline
from tests.support.producer_harness import query, sql
from tests.support.spark import spark  # noqa: F401

pytestmark = pytest.mark.e2e

# `orders` has no `timestamp without time zone` column: without deletion vectors it stays at
# Delta's legacy protocol (1, 2). `events` has one, which Spark writes as timestamp_ntz: the
# timestampNtz table feature, whatever the deletion-vector mode.
COLUMNS = {
    "orders": ("id", "customer", "amount", "qty", "paid", "due", "placed"),
    "events": ("id", "kind", "at_local", "at_utc"),
}


def canon(value: Any) -> Any:
    """One form per value across the three readers: aware timestamps in UTC, naive as is."""
    if isinstance(value, datetime) and value.tzinfo is not None:
        return value.astimezone(UTC)
    return value


def rows(records: Iterator[tuple[Any, ...]] | list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    return sorted(tuple(canon(v) for v in r) for r in records)


def postgres_rows(dsn: str, table: str, columns: tuple[str, ...]) -> list[tuple[Any, ...]]:
    return rows(query(dsn, f"SELECT {', '.join(columns)} FROM {table}"))


def delta_rs_rows(path: str, columns: tuple[str, ...], plain: bool) -> list[tuple[Any, ...]]:
    """Through delta-rs's query engine, which applies deletion vectors; without them its plain
    pyarrow reader (what older integrations use) must give the same rows."""
    table = pa.table(  # the query engine answers in arro3 (Arrow's C interface)
        QueryBuilder()
        .register("t", DeltaTable(path))
        .execute(f"SELECT {', '.join(columns)} FROM t")
        .read_all()
    )
    got = rows(tuple(r[c] for c in columns) for r in table.to_pylist())
    if plain:
        direct = DeltaTable(path).to_pyarrow_table(columns=list(columns)).to_pylist()
        assert rows(tuple(r[c] for c in columns) for r in direct) == got
    return got


def duckdb_connection() -> duckdb.DuckDBPyConnection:
    """DuckDB with its delta extension loaded from the PyPI package (DuckDB would otherwise
    download it, and this machine reaches no extension repository). The binary is the one
    DuckDB signs: it loads with signature checks on."""
    con = duckdb.connect()
    ext = next(
        Path(duckdb_extension_delta.__file__).parent.glob("extensions/v*/delta.duckdb_extension")
    )
    con.execute(f"LOAD '{ext}'")
    con.execute("SET TimeZone = 'UTC'")
    return con


def duckdb_rows(
    con: duckdb.DuckDBPyConnection, path: str, columns: tuple[str, ...]
) -> list[tuple[Any, ...]]:
    return rows(con.execute(f"SELECT {', '.join(columns)} FROM delta_scan(?)", [path]).fetchall())


def log_has_deletion_vectors(path: str) -> bool:
    for commit in sorted(Path(path, "_delta_log").glob("*.json")):
        for line in commit.read_text().splitlines():
            add = json.loads(line).get("add")
            if add and add.get("deletionVector"):
                return True
    return False


def consume(p: Pipeline, lake: str, deletion_vectors: bool) -> None:
    p.consume_available(
        lake_path=lake,
        checkpoint_path=f"{lake}_checkpoint",
        lake_deletion_vectors=deletion_vectors,
        # These tables are small: by default their MERGEs would rewrite files, not write the
        # deletion vectors the readers are to be tried on.
        lake_rewrite_below_bytes=0,
    )


def test_delta_rs_and_duckdb_read_both_lake_modes(
    spark: SparkSession, pg_dsn: str, kafka_bootstrap: str, registry_url: str, tmp_path: Path
) -> None:
    s = f"e2e_readers_{uuid.uuid4().hex[:8]}"
    orders, events = f"{s}.orders", f"{s}.events"
    sql(
        pg_dsn,
        f"CREATE SCHEMA {s}",
        f"CREATE TABLE {orders} (id int PRIMARY KEY, customer text, amount numeric(12,2),"
        " qty bigint, paid boolean, due date, placed timestamptz)",
        f"CREATE TABLE {events} (id bigint PRIMARY KEY, kind text, at_local timestamp,"
        " at_utc timestamptz)",
    )
    lakes = {True: str(tmp_path / "lake_dv"), False: str(tmp_path / "lake_plain")}
    try:
        with pipeline(
            spark, pg_dsn, kafka_bootstrap, registry_url, tmp_path, [orders, events], "e2eread"
        ) as p:
            p.start_producer()
            p.sql(
                f"INSERT INTO {orders} SELECT g, 'customer ' || g, g * 1.25, g % 7, g % 2 = 0,"
                " date '2026-01-01' + g, timestamptz '2026-01-01 00:00:00+00' + g * interval '1 hour'"
                " FROM generate_series(1, 300) g",
                f"INSERT INTO {events} SELECT g, 'k' || g % 3,"
                " timestamp '2026-03-01 12:00:00' + g * interval '1 minute',"
                " timestamptz '2026-03-01 12:00:00+02' + g * interval '1 second'"
                " FROM generate_series(1, 200) g",
            )
            p.wait_published()
            for dv, lake in lakes.items():  # first batch: inserts only (appended)
                consume(p, lake, dv)
            # Updates and deletes spread over the table: MERGEs that, with deletion vectors on,
            # mark the old rows instead of rewriting the files.
            p.sql(
                f"UPDATE {orders} SET amount = amount + 1, paid = NOT paid WHERE id % 5 = 0",
                f"DELETE FROM {orders} WHERE id % 7 = 3",
                f"UPDATE {orders} SET customer = NULL, placed = NULL WHERE id % 11 = 0",
                f"UPDATE {events} SET kind = 'changed', at_local = NULL WHERE id % 4 = 1",
                f"DELETE FROM {events} WHERE id > 180",
            )
            p.wait_published()
            for dv, lake in lakes.items():
                consume(p, lake, dv)

            con = duckdb_connection()
            for dv, lake in lakes.items():
                for name, columns in COLUMNS.items():
                    path = f"{lake}/{s}/{name}"
                    want = postgres_rows(pg_dsn, f"{s}.{name}", columns)
                    assert len(want) > 100
                    assert delta_rs_rows(path, columns, plain=not dv) == want, (dv, name)
                    assert duckdb_rows(con, path, columns) == want, (dv, name)
                    assert log_has_deletion_vectors(path) is dv, (dv, name)
                    protocol = DeltaTable(path).protocol()
                    features = set(protocol.reader_features or ())
                    assert ("deletionVectors" in features) is dv, (dv, name, protocol)
                    assert ("timestampNtz" in features) is (name == "events"), (name, protocol)
                    if not dv and name == "orders":
                        assert (protocol.min_reader_version, protocol.min_writer_version) == (1, 2)
            # A spot check of typed values (not only equal sets): order 5 was updated.
            got = con.execute(
                "SELECT amount, placed, paid FROM delta_scan(?) WHERE id = 5",
                [f"{lakes[True]}/{s}/orders"],
            ).fetchall()
            assert [tuple(canon(v) for v in r) for r in got] == [
                (Decimal("7.25"), datetime(2026, 1, 1, 5, tzinfo=UTC), True)
            ]

            # The plain lake's tables stay plain: a consumer started with deletion vectors on
            # stops on them instead of changing their protocol under their readers.
            p.sql(f"UPDATE {orders} SET qty = qty + 1 WHERE id = 2")
            p.wait_published()
            with pytest.raises(StreamingQueryException, match="WALBRIDGE_LAKE_DELETION_VECTORS"):
                consume(p, lakes[False], True)
            assert not log_has_deletion_vectors(f"{lakes[False]}/{s}/orders")
    finally:
        sql(pg_dsn, f"DROP SCHEMA {s} CASCADE")
