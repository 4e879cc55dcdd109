"""verify's pure parts: row and key texts, buckets, hashes, drill batching, and the drill-down
against in-memory sides (the readers replaced; the SQL formula's agreement with the Python one
needs PostgreSQL: tests/e2e/test_e2e_verify_scale.py)."""

from __future__ import annotations

import hashlib
import math
from typing import Any

import pytest

from spark_consumer import verify
from spark_consumer import verify_checksum as checksum
from spark_consumer.verify_forms import ColumnInfo

pytestmark = pytest.mark.unit


def test_row_text_is_unambiguous() -> None:
    texts: list[list[str | None]] = [
        ["a", "b"],
        ["ab", None],
        ["ab", ""],
        [None, "ab"],
        ["N", "ab"],
        ["1:a", "b"],
        ["", "1:ab"],
        ["a", "b", None],
    ]
    records = [checksum.record(t) for t in texts]
    assert len(set(records)) == len(records)
    assert checksum.record(["é,|", None, ""]) == "3:é,|N0:"


def test_bucket_count_follows_the_estimate_within_bounds() -> None:
    assert checksum.bucket_bits(-1) == checksum.MIN_BITS
    assert checksum.bucket_bits(3000) == checksum.MIN_BITS
    assert checksum.bucket_bits(10_000_000) == 14  # 16,384 buckets of ~610 rows
    assert checksum.bucket_bits(1e11) == checksum.MAX_BITS


def test_bucket_and_hash_are_md5_prefixes() -> None:
    digest = hashlib.md5(b"2:42").hexdigest()
    assert checksum.bucket_of("2:42", 12) == int(digest[:3], 16)
    row = hashlib.md5(b"2:423:abc").hexdigest()
    assert checksum.row_hash("2:423:abc") == int(row[:15], 16) < 2**60
    assert checksum.bucket_and_hash(["42", "abc"], [0], 12) == (
        int(digest[:3], 16),
        int(row[:15], 16),
    )
    # Without a key the whole row is the key.
    assert checksum.bucket_and_hash(["42", "abc"], [], 4)[0] == int(row[0], 16)
    assert all(0 <= checksum.bucket_of(str(i), 5) < 32 for i in range(1000))


def test_float_text_agrees_with_float_equality() -> None:
    assert checksum.float_text("float8", 0.0) == checksum.float_text("float8", -0.0) == "0"
    assert checksum.float_text("float8", math.nan) == checksum.float_text("float4", -math.nan)
    assert checksum.float_text("float8", 1.5) == "3ff8000000000000"
    assert checksum.float_text("float4", 1.5) == "3fc00000"
    assert checksum.float_text("float8", math.inf) == "7ff0000000000000"
    assert checksum.float_text("float8", None) is None


def test_lake_field_texts() -> None:
    arr = ColumnInfo("a", "a", "_text", "text")
    num = ColumnInfo("n", "n", "numeric")
    row: dict[str, Any] = {"a": ["x", None, "1:y"], "n": None, "n__text": "NaN"}
    assert checksum.lake_field_text(arr, row) == "[1:3]|1:xN3:1:y"
    assert checksum.lake_field_text(arr, {"a": []}) == "|"
    assert checksum.lake_field_text(arr, {"a": None}) is None
    assert checksum.lake_field_text(num, row) == "NaN"


def test_sql_quotes_every_identifier() -> None:
    cols = [ColumnInfo('we"ird', "we_ird", "text"), ColumnInfo("f0", "f0", "float8")]
    text = checksum.pg_aggregate_sql(('s"x', "t.y"), cols, [0], 8).as_string(None)
    assert '"s""x"."t.y"' in text and '"we""ird"::text' in text
    assert 'fields."f0"' in text and 'float8send("f0")' in text
    drill = checksum.pg_drill_sql(('s"x', "t.y"), cols, [], 8).as_string(None)
    assert drill.endswith("= ANY(%s)")


def test_drill_batches_bound_rows_and_name_oversized_buckets() -> None:
    pg = {1: (30, 0), 2: (30, 0), 3: (500, 0), 4: (10, 0)}
    lake = {1: (31, 5), 2: (40, 0), 3: (501, 0), 5: (45, 0)}
    buckets = checksum.differing_buckets(pg, lake)
    assert buckets == [1, 2, 3, 4, 5]
    batches, too_large = checksum.drill_batches(buckets, pg, lake, 80)
    assert batches == [[1, 2], [4, 5]] and too_large == [3]


def test_keyless_rows_are_numbered_linearly() -> None:
    rows = [{"x": "1"}] * 3 + [{"x": "2"}]
    keys = verify._by_key(rows, [])
    assert len(keys) == 4
    assert sorted(n for _, n in keys) == [0, 0, 1, 2]


# The drill-down, with both sides in memory.

COLS = [ColumnInfo("id", "id", "int4"), ColumnInfo("v", "v", "text")]


class FakeSides:
    def __init__(self, pg: list[dict[str, Any]], lake: list[dict[str, Any]], bits: int) -> None:
        self.pg, self.lake, self.bits = pg, lake, bits
        self.reads: list[int] = []

    def sums(self, rows: list[dict[str, Any]]) -> checksum.Sums:
        out: checksum.Sums = {}
        for r in rows:
            b, h = checksum.bucket_and_hash([r["id"], r["v"]], [0], self.bits)
            out[b] = checksum.add_sums(out.get(b, (0, 0)), (1, h))
        return out

    def read(self, rows: list[dict[str, Any]], buckets: list[int]) -> dict[Any, Any]:
        chosen = [
            r
            for r in rows
            if checksum.bucket_and_hash([r["id"], r["v"]], [0], self.bits)[0] in buckets
        ]
        self.reads.append(len(chosen))
        return verify._by_key(chosen, ["id"])


def _drill(monkeypatch: pytest.MonkeyPatch, sides: FakeSides, **limits: int) -> verify.TableDiff:
    for name, value in limits.items():
        monkeypatch.setattr(verify, name, value)
    monkeypatch.setattr(verify, "read_pg", lambda *a: sides.read(sides.pg, a[-1]))
    monkeypatch.setattr(verify, "read_lake", lambda *a: sides.read(sides.lake, a[-1]))
    pg, lake = sides.sums(sides.pg), sides.sums(sides.lake)
    differing = checksum.differing_buckets(pg, lake)
    return verify._drill(
        None,  # type: ignore[arg-type]  # only the readers use it
        object(),  # type: ignore[arg-type]
        ("public", "t"),
        COLS,
        ["id"],
        [0],
        sides.bits,
        differing,
        pg,
        lake,
        20,
    )


def _table(n: int) -> list[dict[str, Any]]:
    return [{"id": str(i), "v": f"v{i}"} for i in range(n)]


def test_drill_names_exactly_the_differences(monkeypatch: pytest.MonkeyPatch) -> None:
    pg = _table(5000)
    lake = [dict(r) for r in pg if r["id"] != "17"] + [{"id": "9999", "v": "x"}]
    next(r for r in lake if r["id"] == "100")["v"] = "changed"
    sides = FakeSides(pg, lake, 8)
    d = _drill(monkeypatch, sides)
    assert d.missing == (("17",),) and d.extra == (("9999",),)
    assert d.different == ((("100",), "v", "v100", "changed"),)
    assert d.notes == () and not d.equal
    # Only the (at most three) differing buckets of 256 were read, once per side.
    assert len(sides.reads) == 2 and 0 < sum(sides.reads) <= 2 * 3 * 40


def test_drill_stops_at_its_budget_and_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    pg = _table(5000)
    lake = [{"id": r["id"], "v": r["v"] + "!"} for r in pg]  # every row differs
    sides = FakeSides(pg, lake, 8)
    d = _drill(monkeypatch, sides, DRILL_BATCH_ROWS=100, DRILL_MAX_ROWS=300)
    assert len(d.different) == 20 and d.missing == d.extra == ()
    assert sum(sides.reads) <= 2 * (300 + 100)  # both sides, at most one batch past the budget
    assert any("not complete" in n for n in d.notes)
    assert "note: stopped after reading" in verify.report([d])


def test_oversized_bucket_is_named_not_read(monkeypatch: pytest.MonkeyPatch) -> None:
    pg = _table(400)
    lake = pg[:-1]
    sides = FakeSides(pg, lake, 1)  # two buckets of ~200 rows
    d = _drill(monkeypatch, sides, DRILL_BATCH_ROWS=50)
    assert sides.reads == [] and d.missing == ()
    assert len(d.notes) == 1 and "not read" in d.notes[0] and not d.equal


def test_report_names_skipped_columns_and_notes() -> None:
    equal = verify.TableDiff("public.g", (), (), (), skipped=("total (generated: not published)",))
    cut = verify.TableDiff("public.t", (("1",),), (), (), notes=("stopped after reading 9",))
    assert equal.equal and not cut.equal
    assert verify.report([equal, cut]).splitlines() == [
        "public.g: equal (not compared: total (generated: not published))",
        "public.t: 1 missing, 0 extra, 0 different (first 20 of each)",
        "  missing ('1',)",
        "  note: stopped after reading 9",
    ]


def test_a_failing_side_cancels_the_other() -> None:
    import threading

    cancelled = threading.Event()

    def pg_side() -> checksum.Sums:
        raise RuntimeError("relation does not exist")

    def lake_side() -> checksum.Sums:
        assert cancelled.wait(10), "the lake side was not cancelled"
        raise RuntimeError("job cancelled")

    with pytest.raises(RuntimeError, match="relation does not exist"):
        verify._sums_with_progress("t", 0, pg_side, lake_side, lambda: 0, cancelled.set)
    assert cancelled.is_set()


def test_progress_is_logged_while_both_sides_run(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import logging
    import time

    monkeypatch.setattr(verify, "PROGRESS_EVERY_S", 0.05)

    def slow() -> checksum.Sums:
        time.sleep(0.3)
        return {1: (2, 3)}

    with caplog.at_level(logging.INFO, logger="walbridge.consumer"):
        pg, lake = verify._sums_with_progress("s.t", 1000, lambda: {}, slow, lambda: 500, print)
    assert pg == {} and lake == {1: (2, 3)}
    assert "verify s.t: lake 500 of ~1000 rows (" in caplog.text
    assert "ETA" in caplog.text and "PostgreSQL done" in caplog.text
