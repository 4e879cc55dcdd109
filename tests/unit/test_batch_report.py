"""BatchProcessor.reports stays bounded over a long run (batch_report.keep)."""

from __future__ import annotations

from spark_consumer.batch_report import REPORTS_KEPT, BatchReport, keep


def test_reports_are_kept_newest_first_and_bounded() -> None:
    reports: list[BatchReport] = []
    for batch_id in range(10 * REPORTS_KEPT + 7):
        keep(reports, BatchReport(batch_id))
        assert len(reports) < 2 * REPORTS_KEPT
    assert len(reports) >= REPORTS_KEPT
    ids = [r.batch_id for r in reports]
    assert ids == list(range(10 * REPORTS_KEPT + 7 - len(ids), 10 * REPORTS_KEPT + 7))


def test_a_short_run_keeps_every_report() -> None:
    reports: list[BatchReport] = []
    for batch_id in range(5):
        keep(reports, BatchReport(batch_id), kept=3)
    assert [r.batch_id for r in reports] == [0, 1, 2, 3, 4]
    keep(reports, BatchReport(5), kept=3)
    assert [r.batch_id for r in reports] == [3, 4, 5]
