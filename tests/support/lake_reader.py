"""The lake through an independent reader, delta-rs (not the Spark/Delta that wrote it): the
progress table's rows, and a column's sum and the row count of a table at a version. The e2e
invariant tests and the torture run (deploy/local/torture) check every progress snapshot with
these."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pyarrow as pa
from deltalake import DeltaTable, QueryBuilder


def s3_options(env: Mapping[str, str]) -> dict[str, str]:
    """delta-rs's options for the store that the standard AWS variables in ``env`` name (the
    local stack's s3proxy: plain HTTP, and no locking service, which its renames do not need
    with one writer)."""
    keys = ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION")
    return {k: env[k] for k in keys} | {
        "AWS_ALLOW_HTTP": "true",
        "AWS_S3_ALLOW_UNSAFE_RENAME": "true",
    }


def table_totals(
    path: str, version: int, column: str, storage_options: dict[str, str] | None = None
) -> tuple[int, int]:
    """(sum(column), count(*)) of the table at ``version`` (sum 0 when empty), in one scan.
    Through delta-rs's query engine: its plain pyarrow reader refuses deletion vectors, which
    MERGEs into our tables write."""
    table = (
        QueryBuilder()
        .register("t", DeltaTable(path, version=version, storage_options=storage_options))
        .execute(f'SELECT coalesce(sum("{column}"), 0) AS total, count(*) AS n FROM t')
        .read_all()
    )
    return int(table.column("total")[0].as_py()), int(table.column("n")[0].as_py())


def table_sum(path: str, version: int, column: str) -> int:
    """sum(column) of the table at ``version`` (0 when empty)."""
    return table_totals(path, version, column)[0]


def progress_rows(lake: str) -> list[dict[str, Any]]:
    """Every row of `<lake>/_walbridge/progress`, by batch_id, ``table_versions`` as a dict."""
    table = (
        QueryBuilder()
        .register("p", DeltaTable(f"{lake.rstrip('/')}/_walbridge/progress"))
        .execute("SELECT batch_id, commit_lsn, table_versions FROM p ORDER BY batch_id")
        .read_all()
    )
    rows = pa.table(table).to_pylist()  # delta-rs returns an arro3 table
    for row in rows:
        row["table_versions"] = dict(row["table_versions"] or {})
    return rows


def progress_row_count(lake: str) -> int:
    """How many rows (applied batches) the progress table holds (0 before the first batch)."""
    try:
        dt = DeltaTable(f"{lake.rstrip('/')}/_walbridge/progress")
    except Exception:  # no table yet
        return 0
    table = QueryBuilder().register("p", dt).execute("SELECT count(*) AS n FROM p").read_all()
    return int(table.column("n")[0].as_py())


def latest_commit_lsn(lake: str) -> int | None:
    """The newest progress row's commit_lsn (None before the first batch)."""
    try:
        dt = DeltaTable(f"{lake.rstrip('/')}/_walbridge/progress")
    except Exception:
        return None
    table = (
        QueryBuilder().register("p", dt).execute("SELECT max(commit_lsn) AS m FROM p").read_all()
    )
    value = table.column("m")[0].as_py()
    return None if value is None else int(value)
