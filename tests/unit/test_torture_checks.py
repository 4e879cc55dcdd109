"""The torture run's pure parts (tests/support/torture_checks.py): the seeded fault schedule,
the invariant, the Kafka END-count check and the summary, including that each check fails on a
broken lake state or a missing Kafka event."""

from __future__ import annotations

import pytest

from tests.support import torture_checks as tc

TOTAL = 8_000_000


def test_schedule_is_a_function_of_the_seed() -> None:
    a = tc.schedule(7, 50, 40.0)
    assert a == tc.schedule(7, 50, 40.0)
    assert a != tc.schedule(8, 50, 40.0)
    assert [c.number for c in a] == list(range(1, 51))
    assert all(8.0 <= c.at_s <= 24.0 for c in a)  # 0.2..0.6 of the cycle


def test_schedule_draws_every_kind_and_doubles_of_two_different_kinds() -> None:
    plan = tc.schedule(1, 400, 10.0)
    counts = tc.faults_by_kind(plan)
    assert set(counts) == {k.value for k in tc.Kind} | {tc.DOUBLE}
    doubles = [c for c in plan if len(c.faults) == 2]
    assert doubles and all(c.faults[0].kind != c.faults[1].kind for c in doubles)
    brokers = {f.broker_target for c in plan for f in c.faults if f.kind is tc.Kind.BROKER_KILL}
    assert brokers == set(tc.BROKER_TARGETS)
    stops = [f.stop_s for c in plan for f in c.faults if f.kind is tc.Kind.REGISTRY_STOP]
    assert min(stops) >= tc.REGISTRY_STOP_S[0] and max(stops) <= tc.REGISTRY_STOP_S[1]
    assert any(c.schema_change for c in plan) and not all(c.schema_change for c in plan)


def test_fifty_cycles_strike_every_kind_five_times() -> None:
    """Issue 41's run: 50 cycles, every kind at least 5 times (a kind struck inside a double
    counts): 5 doubles and exactly 5 of each, whatever the seed."""
    for seed in range(50):
        counts = tc.faults_by_kind(tc.schedule(seed, 50, 60.0))
        assert counts == {c: 5 for c in tc.CHOICES}, (seed, counts)


@pytest.mark.parametrize("cycles", [1, 3, 7, 12, 13, 37, 100])
@pytest.mark.parametrize(
    "choices",
    [
        tc.CHOICES,
        tuple(k.value for k in tc.SINGLE_KINDS),  # no doubles
        ("net_partition", "postgres_crash", "consumer_kill_merge"),
        ("producer_kill", "broker_kill", tc.DOUBLE),  # doubles of the two chosen kinds
        ("postgres_crash", tc.DOUBLE),  # one kind: doubles draw from all
        (tc.DOUBLE,),
    ],
)
def test_the_draw_is_balanced_and_a_double_never_repeats_a_kind(
    cycles: int, choices: tuple[str, ...]
) -> None:
    plan = tc.schedule(5, cycles, 20.0, choices)
    assert len(plan) == cycles
    assert all(len({f.kind for f in c.faults}) == len(c.faults) for c in plan)
    singles = [c for c in choices if c != tc.DOUBLE]
    struck = tc.faults_by_kind(plan)
    pairs = {k.value for k in tc.double_kinds(choices)}
    if set(singles) == pairs or tc.DOUBLE not in choices:
        # One deal over the chosen kinds, doubles' pairs included: within one of each other.
        counts = [struck.get(k, 0) for k in singles]
        assert max(counts) - min(counts) <= 1, struck
    if tc.DOUBLE not in choices:
        assert tc.DOUBLE not in struck
    elif not singles:
        assert struck[tc.DOUBLE] == cycles
    else:
        assert struck.get(tc.DOUBLE, 0) >= cycles // (len(singles) + 1) - 1, struck


def test_schedule_restricted_to_chosen_kinds() -> None:
    plan = tc.schedule(3, 20, 10.0, ["postgres_crash"])
    assert {f.kind for c in plan for f in c.faults} == {tc.Kind.POSTGRES_CRASH}
    with pytest.raises(ValueError, match="unknown fault kind"):
        tc.schedule(3, 2, 10.0, ["kill_everything"])


@pytest.mark.parametrize(
    ("text", "expected"),
    # Values of Java's "...".hashCode()
    [("", 0), ("a", 97), ("hello", 99162322), ("walbridge.p.s", None)],
)
def test_java_string_hash(text: str, expected: int | None) -> None:
    h = 0
    for ch in text:  # the definition, for BMP text: s[0]*31^(n-1) + ... + s[n-1], int overflow
        h = (31 * h + ord(ch)) % (1 << 32)
    signed = h - (1 << 32) if h >= 1 << 31 else h
    assert tc.java_string_hash(text) == signed
    if expected is not None:
        assert signed == expected


def test_transaction_state_partition() -> None:
    # "polygenelubricants".hashCode() is Integer.MIN_VALUE: Kafka's Utils.abs maps it to 0.
    assert tc.java_string_hash("polygenelubricants") == -(1 << 31)
    assert tc.transaction_state_partition("polygenelubricants") == 0
    # A negative hash: abs() first, then the modulo.
    h = tc.java_string_hash("walbridge.torture_1.slot_2")
    assert tc.transaction_state_partition("walbridge.torture_1.slot_2") == abs(h) % 50


def test_invariant_holds_on_consistent_states() -> None:
    assert tc.invariant_violation(tc.Sums(0, 0, 0, 0), TOTAL) is None  # before the opening
    assert tc.invariant_violation(tc.Sums(TOTAL // 2, TOTAL // 2, TOTAL // 2, 120), TOTAL) is None
    assert tc.invariant_violation(tc.Sums(TOTAL - 5, 5, 5, 130), TOTAL) is None


@pytest.mark.parametrize(
    "sums",
    [
        # A transfer half applied: checking moved, savings not yet.
        tc.Sums(TOTAL // 2 - 700, TOTAL // 2, TOTAL // 2, 120),
        # savings applied, its history insert not (the keyless table a batch behind).
        tc.Sums(TOTAL // 2 - 700, TOTAL // 2 + 700, TOTAL // 2, 121),
        # Only the opening's checking rows visible.
        tc.Sums(TOTAL // 2, 0, 0, 40),
        # Rows in the lake whose money is gone: every sum 0 is not "before the opening".
        tc.Sums(0, 0, 0, 80),
        # A history row applied twice (a duplicate insert into the keyless table).
        tc.Sums(TOTAL // 2, TOTAL // 2, TOTAL // 2 + 300, 121),
    ],
)
def test_invariant_fails_on_a_partial_or_duplicated_transaction(sums: tc.Sums) -> None:
    assert tc.invariant_violation(sums, TOTAL) is not None


def _tx(tx_id: str, lsn: int, tables: list[str]) -> tuple[list[tc.Event], tc.End]:
    events = [tc.Event(tx_id, lsn, i + 1, t) for i, t in enumerate(tables)]
    counts: dict[str, int] = {}
    for t in tables:
        counts[t] = counts.get(t, 0) + 1
    return events, tc.End(tx_id, len(tables), counts)


def test_end_counts_match_with_duplicates_counted() -> None:
    e1, end1 = _tx("1:100", 100, ["s.checking", "s.savings", "s.history"])
    e2, end2 = _tx("2:200", 200, ["s.checking"])
    # A redelivered event and a redelivered END (at-least-once paths) are fine.
    check = tc.check_end_counts([*e1, e1[1], *e2], [end1, end2, end2])
    assert check.problem_count == 0, check.problems
    assert (check.transactions, check.events, check.duplicates) == (2, 4, 1)


def test_end_check_fails_on_a_missing_event() -> None:
    e1, end1 = _tx("1:100", 100, ["s.checking", "s.savings", "s.history"])
    check = tc.check_end_counts([e1[0], e1[2]], [end1])
    assert check.problem_count == 1
    assert "missing total_order [2]" in check.problems[0]


def test_end_check_fails_on_events_without_end_and_wrong_table_counts() -> None:
    e1, end1 = _tx("1:100", 100, ["s.checking", "s.savings"])
    orphan, _ = _tx("3:300", 300, ["s.history"])
    wrong = tc.End("1:100", 2, {"s.checking": 2})
    check = tc.check_end_counts([*e1, *orphan], [wrong])
    assert check.problem_count == 2
    assert any("per-table counts" in p for p in check.problems)
    assert any("no END marker" in p for p in check.problems)
    # Two different END markers for one transaction.
    assert tc.check_end_counts(e1, [end1, wrong]).problems[0].startswith("tx 1:100: two END")


def test_end_check_fails_on_an_extra_event() -> None:
    e1, end1 = _tx("1:100", 100, ["s.checking"])
    extra = tc.Event("1:100", 100, 2, "s.savings")
    assert tc.check_end_counts([*e1, extra], [end1]).problem_count == 1


def test_summary_line() -> None:
    report = {
        "passed": True,
        "seed": 7,
        "cycles": 3,
        "faults_by_kind": {"producer_kill": 2, "postgres_crash": 1},
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
    }
    line = tc.summary_line(report)
    assert line.startswith("torture: PASS seed=7 cycles=3 ")
    assert "faults[postgres_crash=1,producer_kill=2]" in line
    assert "longest_recovery_s=31.2" in line or "longest_recovery_s=31.3" in line
    assert "FAIL" in tc.summary_line({**report, "passed": False, "longest_recovery_s": None})
