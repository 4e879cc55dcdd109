"""The torture run's fault kinds, network faults included, its cycle counting and its figures
per kind (tests/support/torture_checks.py): the schedule's draws and hold times, --faults and
--help, which cycles count, and the per-kind recovery percentiles, batches and snapshots, with
the summary line that carries them."""

from __future__ import annotations

import pytest

from tests.support import network_faults, torture
from tests.support import torture_checks as tc

NETWORK = set(tc.NETWORK_FAULTS)


def test_every_network_kind_is_a_fault_of_network_faults() -> None:
    assert set(tc.NETWORK_FAULTS.values()) == set(network_faults.FAULTS)
    assert {tc.FAMILIES[k] for k in tc.SINGLE_KINDS} == {"process", "network", "postgres"}
    assert tc.FAMILIES[tc.Kind.POSTGRES_CRASH] == "postgres"
    assert set(tc.KIND_HELP) == set(tc.CHOICES)  # --help has a line for every kind


def test_default_schedule_draws_every_network_kind_on_every_link() -> None:
    plan = tc.schedule(5, 600, 60.0)
    faults = [f for c in plan for f in c.faults]
    assert {f.kind for f in faults} == set(tc.Kind)
    net = [f for f in faults if f.kind in NETWORK]
    assert {f.link for f in net} == set(tc.LINKS)
    assert all(f.link == "" and f.hold_s == 0.0 for f in faults if f.kind not in NETWORK)
    for f in net:
        lo, hi = tc.network_hold_range(f.kind, 60.0)
        assert lo <= f.hold_s <= hi, f
        assert f.label() == f"{f.kind.value}({f.link},{f.hold_s:.1f}s)"


@pytest.mark.parametrize(
    ("seconds_per_cycle", "longest"),
    # 5 s to 5 min, 0.4 of the cycle in between: a short cycle holds 5 s, a long one 5 min.
    [(5.0, 5.0), (20.0, 8.0), (60.0, 24.0), (750.0, 300.0), (3600.0, 300.0)],
)
def test_partitions_last_5_s_to_5_min_scaled_by_the_cycle(
    seconds_per_cycle: float, longest: float
) -> None:
    for kind in (tc.Kind.NET_PARTITION, tc.Kind.NET_SILENT):
        assert tc.network_hold_range(kind, seconds_per_cycle) == (5.0, longest)
    plan = tc.schedule(1, 300, seconds_per_cycle, ["net_partition"])
    holds = [c.faults[0].hold_s for c in plan]
    assert min(holds) >= 5.0 and max(holds) <= longest
    if longest > 5.0:
        assert max(holds) - min(holds) > (longest - 5.0) / 2  # spread over the range


def test_other_network_holds_end_within_their_cycle() -> None:
    for kind in (tc.Kind.NET_LATENCY, tc.Kind.NET_BANDWIDTH, tc.Kind.NET_RESET):
        for spc in (10.0, 60.0, 600.0):
            lo, hi = tc.network_hold_range(kind, spc)
            assert 0 < lo <= hi
            assert hi <= max(lo, 0.4 * spc)  # struck by 0.6 of the cycle: over by its end
    with pytest.raises(ValueError, match="not a network fault"):
        tc.network_hold_range(tc.Kind.PRODUCER_KILL, 60.0)


def test_double_faults_draw_from_the_chosen_kinds() -> None:
    plan = tc.schedule(2, 200, 30.0, ["double", "net_reset", "postgres_crash"])
    doubles = [c for c in plan if len(c.faults) == 2]
    assert doubles
    for c in doubles:
        assert {f.kind for f in c.faults} == {tc.Kind.NET_RESET, tc.Kind.POSTGRES_CRASH}
    # "double" alone (or with one kind): two of every kind.
    assert tc.double_kinds(["double"]) == tc.SINGLE_KINDS
    assert tc.double_kinds(["double", "producer_kill"]) == tc.SINGLE_KINDS


def test_needs_network_only_when_a_network_fault_can_strike() -> None:
    assert tc.needs_network(tc.CHOICES)
    assert tc.needs_network(["net_silent"])
    assert not tc.needs_network(["producer_kill", "postgres_crash"])
    assert not tc.needs_network(["double", "producer_kill", "postgres_crash"])
    assert tc.needs_network(["double"])  # draws two of all kinds
    assert tc.needs_network(["double", "broker_kill", "net_latency"])


def test_parse_faults() -> None:
    assert tc.parse_faults("net_partition, postgres_crash,,net_partition") == (
        "net_partition",
        "postgres_crash",
    )
    with pytest.raises(ValueError, match=r"unknown fault kind\(s\) \['net_flood'\]"):
        tc.parse_faults("net_flood,producer_kill")
    with pytest.raises(ValueError, match="no fault kind"):
        tc.parse_faults(" , ")


def test_cli_defaults_to_every_kind_and_rejects_unknown_ones(
    capsys: pytest.CaptureFixture[str],
) -> None:
    options = torture.parse(["--cycles", "4", "--seconds-per-cycle", "30", "--seed", "1"])
    assert options.faults == tc.CHOICES
    assert options.commit_wait_s == 600.0
    narrowed = torture.parse(
        ["--cycles", "1", "--seconds-per-cycle", "9", "--seed", "1", "--faults", "net_reset"]
    )
    assert narrowed.faults == ("net_reset",)
    with pytest.raises(SystemExit):
        torture.parse(["--cycles", "1", "--seconds-per-cycle", "9", "--seed", "1",
                       "--faults", "net_flood"])  # fmt: skip
    assert "net_flood" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        torture.parse(["--help"])
    out = capsys.readouterr().out
    for kind, text in tc.KIND_HELP.items():
        assert f"  {kind}" in out and text in out


def test_a_cycle_counts_only_after_a_new_progress_row() -> None:
    assert tc.counts(1, 0)  # the first cycle: any batch at all
    assert not tc.counts(0, 0)
    assert tc.counts(5, 4)
    assert not tc.counts(4, 4)  # nothing committed since the previous fault ended


def test_cycle_kinds() -> None:
    assert tc.cycle_kinds(["net_reset"]) == ("net_reset",)
    assert tc.cycle_kinds(["net_reset", "producer_kill"]) == (
        "net_reset",
        "producer_kill",
        "double",
    )


def test_percentile_nearest_rank() -> None:
    assert tc.percentile([], 0.5) is None
    assert tc.percentile([7.0], 0.99) == 7.0
    values = [float(v) for v in range(1, 101)]  # 1..100
    assert tc.percentile(values, 0.50) == 50.0
    assert tc.percentile(values, 0.99) == 99.0
    assert tc.percentile([3.0, 1.0, 2.0], 0.5) == 2.0
    assert tc.percentile([3.0, 1.0, 2.0, 10.0], 0.99) == 10.0


def test_per_kind_figures() -> None:
    F = tc.CycleFigures
    cycles = [
        F(("net_partition",), True, 12.0, rows_at_fault=2, rows_at_next=5),  # 3 batches
        F(("postgres_crash",), True, 30.0, rows_at_fault=5, rows_at_next=6),
        F(("net_partition",), True, 20.0, rows_at_fault=6, rows_at_next=6),  # none after
        F(("net_partition",), False, 99.0, rows_at_fault=6, rows_at_next=9),  # not counted
        F(("producer_kill", "net_reset", "double"), True, None, 9, 11),  # never recovered
    ]
    checked = [0, 1, 2, 3, 5, 9, 10]  # row 4 was not read (say), rows 6-8 neither
    figures = tc.per_kind(cycles, checked)
    assert figures["net_partition"] == {
        "cycles": 2,
        "uncounted": 1,
        "never_recovered": 0,
        "batches_committed": 3,
        "snapshots_checked": 2,  # rows 2, 3 (4 not read)
        "recovery_p50_s": 12.0,
        "recovery_p99_s": 20.0,
        "recovery_max_s": 20.0,
    }
    assert figures["postgres_crash"]["batches_committed"] == 1
    assert figures["postgres_crash"]["snapshots_checked"] == 1  # row 5
    for kind in ("producer_kill", "net_reset", "double"):
        f = figures[kind]
        assert (f["cycles"], f["never_recovered"], f["batches_committed"]) == (1, 1, 2)
        assert f["snapshots_checked"] == 2
        assert f["recovery_p50_s"] is f["recovery_max_s"] is None
    # A window can't go backwards (a count read while the log was rewritten, say).
    assert (
        tc.per_kind([F(("net_reset",), True, 1.0, 5, 3)], [])["net_reset"]["batches_committed"] == 0
    )


def test_summary_line_keeps_its_form_and_gains_the_per_kind_figures() -> None:
    report = {
        "passed": True,
        "seed": 7,
        "cycles": 2,
        "cycles_uncounted": 1,
        "faults_by_kind": {"net_partition": 2, "postgres_crash": 1},
        "transactions": 10,
        "rows": 90,
        "events": 40,
        "duplicates": 0,
        "lost": 0,
        "diverged": 0,
        "snapshots_checked": 12,
        "invariant_violations": 0,
        "end_mismatches": 0,
        "longest_recovery_s": 31.25,
        "per_kind": tc.per_kind(
            [
                tc.CycleFigures(("net_partition",), True, 12.0, 0, 3),
                tc.CycleFigures(("postgres_crash",), True, 31.25, 3, 4),
                tc.CycleFigures(("net_partition",), False, 5.0, 4, 4),
            ],
            range(4),
        ),
    }
    line = tc.summary_line(report)
    assert line.startswith("torture: PASS seed=7 cycles=2 uncounted=1 faults[")
    assert (
        " per_kind[net_partition:cycles=1,p50=12.0,p99=12.0,max=12.0,batches=3,checked=3;"
        "postgres_crash:cycles=1,p50=31.2,p99=31.2,max=31.2,batches=1,checked=1] "
    ) in line
    assert line.endswith("longest_recovery_s=31.2")
    # No uncounted cycle: not mentioned; no recovery: None.
    quiet = tc.summary_line({**report, "cycles_uncounted": 0, "longest_recovery_s": None})
    assert " uncounted=" not in quiet and quiet.endswith("longest_recovery_s=None")


def test_a_column_is_added_while_the_registry_is_cut_off() -> None:
    assert tc.needs_registry(tc.Fault(tc.Kind.REGISTRY_STOP, stop_s=9.0))
    assert tc.needs_registry(tc.Fault(tc.Kind.NET_PARTITION, link="producer_registry", hold_s=5))
    assert not tc.needs_registry(tc.Fault(tc.Kind.NET_PARTITION, link="producer_kafka", hold_s=5))
    assert not tc.needs_registry(tc.Fault(tc.Kind.POSTGRES_CRASH))
