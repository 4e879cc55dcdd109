"""Slot safety's pure parts (issue 39): loss classification, the slot record, the walsender
commands and the settings a server's version must allow."""

from __future__ import annotations

from dataclasses import replace

import pytest

from producer.config import load_config
from producer.errors import ConfigError
from producer.metrics import Metrics
from producer.replication import ErrorKind, ReplicationConfig, ReplicationError
from producer.replication.commands import alter_slot_failover_command, create_slot_command
from producer.replication.setup import SlotState, SystemIdentity, slot_state_from_row
from producer.slot_guard import lost_error, snapshot_progress
from producer.slot_loss import Evidence, LossReason, at_start, while_running
from producer.slot_record import SlotRecord, record_key
from schemas.snapshot_state import DONE, PENDING, RUNNING, TableState, requested

pytestmark = pytest.mark.unit

IDENTITY = SystemIdentity(system_id="7311", timeline=1, xlogpos=0x5000, dbname="app")
RECORD = SlotRecord(
    slot="s", system_id="7311", timeline=1, database="app", created_lsn=0x100,
    created_ms=1_700_000_000_000, confirmed_lsn=0x2000, failover=None,
)  # fmt: skip
ALIVE = SlotState(
    slot_name="s", plugin="pgoutput", slot_type="logical", database="app", active_pid=None,
    confirmed_flush_lsn=0x3000, two_phase=False, wal_status="reserved",
)  # fmt: skip


# --- classification ------------------------------------------------------------------------


def test_a_new_slot_is_not_a_loss() -> None:
    assert at_start("s", None, IDENTITY, Evidence(record=None), 0x5000) is None
    assert at_start("s", ALIVE, IDENTITY, Evidence(record=RECORD), 0x5000) is None


def test_missing_slot_with_its_record_is_a_loss_from_what_kafka_holds() -> None:
    loss = at_start("s", None, IDENTITY, Evidence(record=RECORD, resume_lsn=0x2800), 0x5000)
    assert loss is not None
    assert loss.reason is LossReason.MISSING and loss.detail == "the slot was dropped"
    assert (loss.from_lsn, loss.to_lsn) == (0x2800, 0x5000)
    assert loss.describe() == (
        "replication slot 's' is lost: missing (the slot was dropped); the changes from LSN "
        "0/2800 to 0/5000 can no longer be read from it, so the lake would miss them"
    )


def test_missing_slot_on_a_new_timeline_is_a_failover_without_a_synced_slot() -> None:
    promoted = replace(IDENTITY, timeline=2)
    loss = at_start("s", None, promoted, Evidence(record=RECORD), 0x5000)
    assert loss is not None and loss.reason is LossReason.FAILOVER
    assert "timeline moved from 1 to 2" in loss.detail
    assert loss.from_lsn == 0x2000  # the record's confirmed position


def test_missing_slot_on_another_cluster_names_both_identifiers() -> None:
    other = replace(IDENTITY, system_id="9999", timeline=2)
    loss = at_start("s", None, other, Evidence(record=RECORD), 0x5000)
    assert loss is not None and loss.reason is LossReason.MISSING
    assert "9999" in loss.detail and "7311" in loss.detail


@pytest.mark.parametrize(
    ("evidence", "held"),
    [
        (Evidence(record=None, resume_lsn=0x10), "an exactly-once resume point"),
        (Evidence(record=None, snapshot_progress=True), "snapshot progress"),
    ],
)
def test_missing_slot_without_a_record_but_other_state_is_a_loss(
    evidence: Evidence, held: str
) -> None:
    loss = at_start("s", None, IDENTITY, evidence, 0x5000)
    assert loss is not None and loss.reason is LossReason.MISSING
    assert held in loss.detail


def test_unknown_start_of_the_range_is_said() -> None:
    loss = at_start("s", None, IDENTITY, Evidence(record=None, snapshot_progress=True), 0x5000)
    assert loss is not None and loss.range_text() == "from LSN an unknown position to 0/5000"


@pytest.mark.parametrize(
    ("change", "reason", "detail"),
    [
        ({"wal_status": "lost"}, LossReason.WAL_LOST, "max_slot_wal_keep_size"),
        (
            {"wal_status": "lost", "invalidation_reason": "wal_removed"},
            LossReason.WAL_LOST,
            "'wal_removed'",
        ),
        ({"invalidation_reason": "idle_timeout"}, LossReason.INVALIDATED, "'idle_timeout'"),
        ({"conflicting": True}, LossReason.INVALIDATED, "conflict with recovery"),
    ],
)
def test_invalidated_slot_is_a_loss(
    change: dict[str, object], reason: LossReason, detail: str
) -> None:
    state = replace(ALIVE, **change)  # type: ignore[arg-type]
    loss = at_start("s", state, IDENTITY, Evidence(record=None), 0x5000)
    assert loss is not None and loss.reason is reason and detail in loss.detail
    assert loss.from_lsn == 0x3000  # the slot's own confirmed_flush_lsn is the furthest known


def test_while_running_missing_and_invalidated() -> None:
    assert while_running("s", ALIVE, 0x3000, 0x5000) is None
    gone = while_running("s", None, 0x3100, 0x5000)
    assert gone is not None and gone.reason is LossReason.MISSING and gone.from_lsn == 0x3100
    lost = while_running("s", replace(ALIVE, wal_status="lost"), 0x3100, 0x5000)
    assert lost is not None and lost.reason is LossReason.WAL_LOST and lost.from_lsn == 0x3100


def test_while_running_a_reconnect_to_a_new_timeline_without_the_slot_is_a_failover() -> None:
    promoted = replace(IDENTITY, timeline=3)
    loss = while_running("s", None, 0x3100, 0x5000, identity=promoted, record=RECORD)
    assert loss is not None and loss.reason is LossReason.FAILOVER
    assert "from 1 to 3" in loss.detail and loss.from_lsn == 0x3100
    same = while_running("s", None, 0x3100, 0x5000, identity=IDENTITY, record=RECORD)
    assert same is not None and same.detail == "the slot was dropped"


def test_lost_error_says_what_was_done_and_how_to_start_over() -> None:
    loss = at_start("s", None, IDENTITY, Evidence(record=RECORD), 0x5000)
    assert loss is not None
    error = lost_error(loss, while_running=False)
    assert "created no slot and streamed nothing" in str(error)
    assert "--on-slot-loss resnapshot" in str(error) and not error.while_running
    assert "what it confirmed before is in Kafka" in str(lost_error(loss, while_running=True))


def test_only_published_chunks_count_as_snapshot_progress() -> None:
    # Pending records are written before a new slot exists: a crash right after is no loss.
    assert not snapshot_progress({"public.a": requested("public.a", 0)})
    for status in (RUNNING, DONE):
        assert snapshot_progress({"public.a": TableState("public.a", status)})


# --- the record --------------------------------------------------------------------------------


def test_record_round_trip_and_key() -> None:
    assert SlotRecord.decode(RECORD.encode()) == RECORD
    failover = replace(RECORD, failover=True, confirmed_lsn=None)
    assert SlotRecord.decode(failover.encode()) == failover
    assert record_key("s") == b"slot:s" and record_key("s") != b"s"  # never the resume point's


@pytest.mark.parametrize(
    "raw", [b"{}", b'{"v": 2, "slot": "s"}', b"not json", b'{"v": 1, "slot": "s"}', b"[]"]
)
def test_unreadable_record_is_an_error(raw: bytes) -> None:
    with pytest.raises(ValueError, match="unreadable slot record"):
        SlotRecord.decode(raw)


def test_seen_keeps_the_creation_and_moves_the_rest() -> None:
    seen = RECORD.seen(timeline=2, confirmed_lsn=0x4000)
    assert (seen.timeline, seen.confirmed_lsn, seen.created_lsn) == (2, 0x4000, 0x100)
    assert RECORD.seen(timeline=1, confirmed_lsn=None).confirmed_lsn == 0x2000


def test_snapshot_state_truncate_is_written_only_when_set() -> None:
    plain = requested("public.a", 5)
    assert b"truncate" not in plain.encode()
    marked = requested("public.a", 5, truncate=True)
    assert TableState.decode(marked.encode()) == marked and marked.status == PENDING


# --- pg_replication_slots across majors -----------------------------------------------------


def test_slot_state_from_rows_of_15_and_17() -> None:
    pg15 = {
        "slot_name": "s", "plugin": "pgoutput", "slot_type": "logical", "database": "app",
        "active_pid": None, "confirmed_flush_lsn": "0/3000", "restart_lsn": "0/2F00",
        "two_phase": False, "wal_status": "reserved", "safe_wal_size": None,
    }  # fmt: skip
    state = slot_state_from_row(pg15)
    assert state == replace(ALIVE, restart_lsn=0x2F00)
    assert (state.failover, state.synced, state.invalidation_reason) == (None, None, None)
    pg17 = pg15 | {
        "conflicting": False, "invalidation_reason": "wal_removed", "failover": True,
        "synced": False, "safe_wal_size": 1048576, "wal_status": "lost",
    }  # fmt: skip
    state = slot_state_from_row(pg17)
    assert (state.failover, state.synced, state.conflicting) == (True, False, False)
    assert (state.invalidation_reason, state.safe_wal_size) == ("wal_removed", 1048576)


# --- commands and version checks -------------------------------------------------------------


def test_failover_slot_commands() -> None:
    assert create_slot_command("s_1", export_snapshot=False, two_phase=False, failover=True) == (
        b"CREATE_REPLICATION_SLOT \"s_1\" LOGICAL pgoutput (SNAPSHOT 'nothing', FAILOVER)"
    )
    assert alter_slot_failover_command("s_1") == b'ALTER_REPLICATION_SLOT "s_1" (FAILOVER true)'
    with pytest.raises(ReplicationError):
        alter_slot_failover_command('x" (TWO_PHASE)')


@pytest.mark.parametrize(
    ("mode", "version", "failover"),
    [("auto", 170006, True), ("auto", 160010, False), ("off", 180001, False), ("on", 170000, True)],
)
def test_failover_follows_the_mode_and_the_version(mode: str, version: int, failover: bool) -> None:
    config = ReplicationConfig(slot="s", publication="p", failover_slot=mode)
    assert config.failover_for(version) is failover


def test_failover_on_before_17_is_refused_naming_the_version() -> None:
    config = ReplicationConfig(slot="s", publication="p", failover_slot="on")
    with pytest.raises(ReplicationError, match="PostgreSQL 16") as info:
        config.failover_for(160010)
    assert info.value.kind is ErrorKind.CONFIG


def test_origin_none_needs_16_and_is_sent_to_pgoutput() -> None:
    config = ReplicationConfig(slot="s", publication="p", origin="none")
    with pytest.raises(ReplicationError, match="PostgreSQL 15"):
        config.failover_for(150018)
    assert config.failover_for(160000) is False
    assert ("origin", "none") in config.plugin_options()
    plain = ReplicationConfig(slot="s", publication="p")
    assert all(name != "origin" for name, _ in plain.plugin_options())  # 15 rejects the option


def test_replication_config_refuses_unknown_modes() -> None:
    with pytest.raises(ReplicationError, match="origin"):
        ReplicationConfig(slot="s", publication="p", origin="local")
    with pytest.raises(ReplicationError, match="failover_slot"):
        ReplicationConfig(slot="s", publication="p", failover_slot="yes")


# --- producer settings ----------------------------------------------------------------------

BASE = {
    "WALBRIDGE_PG_DSN": "dbname=app",
    "WALBRIDGE_KAFKA_BOOTSTRAP": "k:9092",
    "WALBRIDGE_SCHEMA_REGISTRY_URL": "http://r",
}


def test_slot_settings_defaults_flags_and_variables() -> None:
    config = load_config([], BASE)
    assert (config.on_slot_loss, config.failover_slot, config.origin) == ("stop", "auto", "any")
    assert config.reconnect_timeout_s == 300.0
    config = load_config(
        ["--on-slot-loss", "resnapshot", "--failover-slot", "off"],
        BASE | {"WALBRIDGE_ORIGIN": "none", "WALBRIDGE_RECONNECT_TIMEOUT_S": "0"},
    )
    assert (config.on_slot_loss, config.failover_slot, config.origin) == (
        "resnapshot",
        "off",
        "none",
    )
    assert config.reconnect_timeout_s == 0


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"WALBRIDGE_ON_SLOT_LOSS": "recreate"}, "on_slot_loss"),
        ({"WALBRIDGE_FAILOVER_SLOT": "true"}, "failover_slot"),
        ({"WALBRIDGE_ORIGIN": "local"}, "origin"),
        ({"WALBRIDGE_RECONNECT_TIMEOUT_S": "-1"}, "reconnect_timeout_s"),
    ],
)
def test_bad_slot_settings_fail_fast(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config([], BASE | env)


def test_wal_status_gauge_has_one_current_state() -> None:
    metrics = Metrics()
    metrics.set_wal_status("unreserved")

    def sample(status: str) -> float | None:
        return metrics.registry.get_sample_value("walbridge_slot_wal_status", {"status": status})

    assert [sample(s) for s in ("reserved", "unreserved", "lost", "missing")] == [0, 1, 0, 0]
    metrics.set_wal_status(None)
    assert (sample("missing"), sample("unreserved")) == (1, 0)
