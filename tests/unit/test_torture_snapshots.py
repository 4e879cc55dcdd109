"""The torture run's snapshot checker against small Delta tables written with delta-rs in a temp
directory: a lake history whose progress rows all name whole transactions passes; one progress
row naming a state where a transaction is half applied fails, naming the batch."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
from deltalake import write_deltalake

from tests.support.torture_lake import check_progress_snapshots

S = "tort"
TOTAL = 400


def _write(path: Path, rows: list[dict[str, object]], schema: pa.Schema) -> None:
    write_deltalake(str(path), pa.Table.from_pylist(rows, schema=schema), mode="overwrite")


def _lake(tmp_path: Path, broken: bool) -> Path:
    lake = tmp_path / "lake"
    money = pa.schema([("id", pa.int64()), ("balance", pa.int64())])
    hist = pa.schema([("account", pa.string()), ("delta", pa.int64())])
    # Version 0: the opening; version 1: a transfer of 50 from checking 1 to savings 1.
    _write(lake / S / "checking", [{"id": 1, "balance": 100}, {"id": 2, "balance": 100}], money)
    _write(lake / S / "checking", [{"id": 1, "balance": 50}, {"id": 2, "balance": 100}], money)
    _write(lake / S / "savings", [{"id": 1, "balance": 100}, {"id": 2, "balance": 100}], money)
    _write(lake / S / "savings", [{"id": 1, "balance": 150}, {"id": 2, "balance": 100}], money)
    _write(
        lake / S / "history",
        [{"account": "s1", "delta": 100}, {"account": "s2", "delta": 100}],
        hist,
    )
    _write(
        lake / S / "history",
        [{"account": "s1", "delta": 100}, {"account": "s2", "delta": 100}, {"account": "s1", "delta": 50}],
        hist,
    )  # fmt: skip
    tables = [f"{S}.checking", f"{S}.savings", f"{S}.history"]
    snapshots = [
        {},  # before any table exists
        dict.fromkeys(tables, 0),
        # The transfer's savings + history at version 1; checking at 0 when broken.
        {f"{S}.checking": 0 if broken else 1, f"{S}.savings": 1, f"{S}.history": 1},
    ]
    progress = pa.schema(
        [("batch_id", pa.int64()), ("commit_lsn", pa.int64()),
         ("table_versions", pa.map_(pa.string(), pa.int64()))]
    )  # fmt: skip
    _write(
        lake / "_walbridge" / "progress",
        [
            {"batch_id": i, "commit_lsn": 100 * i, "table_versions": list(v.items())}
            for i, v in enumerate(snapshots)
        ],
        progress,
    )
    return lake


def test_whole_transactions_in_every_snapshot_pass(tmp_path: Path) -> None:
    result = check_progress_snapshots(_lake(tmp_path, broken=False), S, TOTAL)
    assert result["violations"] == []
    assert result["checked"] == 3
    assert result["table_versions_read"] == 6


def test_a_half_applied_transfer_in_one_snapshot_fails(tmp_path: Path) -> None:
    result = check_progress_snapshots(_lake(tmp_path, broken=True), S, TOTAL)
    assert len(result["violations"]) == 1
    assert result["violations"][0].startswith("batch 2 ")
    assert "checking 200 + savings 250 != 400" in result["violations"][0]
