"""The pure rules of lake maintenance (maintenance_policy.py), the commit-conflict retry
(delta_conflicts.py) and the maintenance settings."""

from __future__ import annotations

import pytest

from spark_consumer import delta_conflicts
from spark_consumer import maintenance_policy as mp
from spark_consumer.config import parse_maintain, parse_run
from spark_consumer.errors import ConfigError

pytestmark = pytest.mark.unit

MIB = 2**20
ENV = {
    "WALBRIDGE_KAFKA_BOOTSTRAP": "k:9092",
    "WALBRIDGE_SCHEMA_REGISTRY_URL": "http://r",
    "WALBRIDGE_TOPIC_PREFIX": "db",
    "WALBRIDGE_LAKE_PATH": "/lake",
}


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("7 days", 7 * 86400), ("36 hours", 36 * 3600), ("90 s", 90), ("600", 600), ("1.5h", 5400)],
)
def test_durations(text: str, seconds: float) -> None:
    assert mp.parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "7 weeks", "-1 days", "days"])
def test_bad_durations_name_the_text(text: str) -> None:
    with pytest.raises(ValueError, match="is not a duration"):
        mp.parse_duration(text)


def test_small_tables_pack_to_small_files() -> None:
    target = 128 * MIB
    assert mp.target_file_bytes(100_000, target) == mp.MIN_TARGET_BYTES
    assert mp.target_file_bytes(64 * MIB, target) == 8 * MIB  # an eighth of the table
    assert mp.target_file_bytes(10 * 2**30, target) == target
    # The 7.6 MB table of the issue: about eight files of 1 MiB, only files below 512 KiB
    # are packed again.
    assert mp.files_needed(7_600_000, target) == 8
    assert mp.min_file_bytes(mp.target_file_bytes(7_600_000, target)) == 512 * 1024


def test_compaction_is_due_by_files_beyond_what_the_size_needs() -> None:
    target = 128 * MIB
    assert not mp.compaction_due(1 + 31, 1000, target, 32)
    assert mp.compaction_due(1 + 32, 1000, target, 32)
    # A 1 GiB table needs eight 128 MiB files: 39 files are within the bound, 40 are not.
    assert not mp.compaction_due(39, 2**30, target, 32)
    assert mp.compaction_due(40, 2**30, target, 32)


def test_retention_keeps_files_and_log_for_the_window_plus_a_margin() -> None:
    week = mp.Retention(7 * 86400.0)
    assert week.kept_s == 7 * 86400 + 3600
    assert week.interval == "interval 608400 seconds"
    assert week.vacuum_every_s == 3600
    short = mp.Retention(20.0)
    assert (short.kept_s, short.vacuum_every_s) == (40.0, 5.0)
    assert short.oldest_kept_ms(100_000) == 80_000


def test_budget_is_a_share_of_the_time_and_an_overspend_is_repaid() -> None:
    b = mp.Budget(0.2, cap_s=60.0)
    assert not b.may_start()
    b.earn(5.0)  # a 5 s batch earns 1 s
    assert b.may_start()
    b.spend(3.0)  # one 3 s compaction overspends by 2 s
    b.earn(5.0)
    assert not b.may_start()  # -1 s
    b.earn(10.0)
    assert b.may_start()
    b.earn(10_000.0)
    assert b.balance_s == 60.0  # an idle stretch banks no more than the cap
    assert not mp.Budget(0.0).may_start()


class _Conflict(Exception):
    pass


def test_conflicts_are_recognised_by_class_or_by_delta_s_text() -> None:
    from delta.exceptions import ConcurrentDeleteReadException

    assert delta_conflicts.is_conflict(ConcurrentDeleteReadException("files were deleted"))
    assert delta_conflicts.is_conflict(
        RuntimeError("An error occurred: io.delta.exceptions.ConcurrentAppendException: ...")
    )
    assert delta_conflicts.is_conflict(RuntimeError("[DELTA_CONCURRENT_DELETE_READ] ..."))
    assert not delta_conflicts.is_conflict(RuntimeError("[DELTA_MERGE_MISSING_WHEN] ..."))


def test_retry_reads_the_table_again_and_backs_off() -> None:
    calls, forgotten, slept = [], [], []

    def action() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise RuntimeError("io.delta.exceptions.ConcurrentAppendException: files added")
        return "done"

    got = delta_conflicts.retry_on_conflict(
        action, "table t", lambda: forgotten.append(1), sleep=slept.append
    )
    assert (got, len(calls), len(forgotten)) == ("done", 3, 2)
    assert slept == [0.2, 0.4]


def test_retry_gives_up_after_its_attempts_and_never_on_other_errors() -> None:
    def conflict() -> None:
        raise RuntimeError("io.delta.exceptions.ConcurrentAppendException: again")

    with pytest.raises(RuntimeError, match="again"):
        delta_conflicts.retry_on_conflict(conflict, "t", attempts=3, sleep=lambda s: None)
    calls = []

    def broken() -> None:
        calls.append(1)
        raise ValueError("not a conflict")

    with pytest.raises(ValueError):
        delta_conflicts.retry_on_conflict(broken, "t", sleep=lambda s: None)
    assert len(calls) == 1
    assert delta_conflicts.waits(9)[-1] == delta_conflicts.MAX_WAIT_S


def test_maintenance_settings_defaults_and_errors() -> None:
    c = parse_run([], ENV)
    assert c.lake_rewrite_below_bytes == 0  # deletion vectors always: bytes follow the rows
    assert (c.lake_compaction, c.lake_vacuum, c.lake_maintenance_budget) == (True, True, 0.2)
    assert c.lake_consistent_read_retention == 7 * 86400
    env = {**ENV, "WALBRIDGE_LAKE_CONSISTENT_READ_RETENTION": "12 hours"}
    assert parse_run(["--no-lake-vacuum"], env).lake_consistent_read_retention == 43200
    with pytest.raises(ConfigError, match="--lake-maintenance-budget must be between 0 and 1"):
        parse_run(["--lake-maintenance-budget", "1.5"], ENV)
    with pytest.raises(ConfigError, match="WALBRIDGE_LAKE_CONSISTENT_READ_RETENTION"):
        parse_run([], {**ENV, "WALBRIDGE_LAKE_CONSISTENT_READ_RETENTION": "soon"})
    with pytest.raises(ConfigError, match="lake-target-file-bytes"):
        parse_run(["--lake-target-file-bytes", "1000"], ENV)
    m = parse_maintain(["--purge-deletion-vectors"], {"WALBRIDGE_LAKE_PATH": "/lake/"})
    assert (m.lake_path, m.purge_deletion_vectors) == ("/lake", True)


def test_no_vacuum_while_the_latest_progress_row_is_outside_the_window() -> None:
    r = mp.Retention(60.0)
    now = 1_000_000
    assert r.may_vacuum(None, now)  # no progress row yet: nothing is promised
    assert r.may_vacuum(now - 60_000, now)
    assert not r.may_vacuum(now - 60_001, now)  # an idle pipeline: its latest row must stay
