"""The torture run's pure parts (deploy/local/torture; the I/O lives in tests/support/torture.py):
the fault schedule drawn from a seed, the cross-table invariant of one lake state, the Kafka
END-count check, and the summary line. No I/O here, so tests/unit checks each one, including
that each check fails when it should.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class Kind(StrEnum):
    PRODUCER_KILL = "producer_kill"
    CONSUMER_KILL_MERGE = "consumer_kill_merge"  # kill -9 while a MERGE writes its files
    CONSUMER_KILL_PROGRESS = "consumer_kill_progress"  # while the progress row is written
    BROKER_KILL = "broker_kill"
    REGISTRY_STOP = "registry_stop"  # longer than the producer's registry retry interval
    POSTGRES_CRASH = "postgres_crash"  # pg_ctl stop -m immediate, then start
    # Network faults through Toxiproxy on one link (LINKS), held for a while (tests/support/
    # network_faults.py has the toxics; NETWORK_FAULTS maps a kind to its name there).
    NET_LATENCY = "net_latency"
    NET_BANDWIDTH = "net_bandwidth"
    NET_RESET = "net_reset"
    NET_SILENT = "net_silent"
    NET_PARTITION = "net_partition"


SINGLE_KINDS: tuple[Kind, ...] = tuple(Kind)
DOUBLE = "double"  # two faults at once
CHOICES: tuple[str, ...] = (*(k.value for k in SINGLE_KINDS), DOUBLE)

NETWORK_FAULTS: Mapping[Kind, str] = {
    Kind.NET_LATENCY: "latency",
    Kind.NET_BANDWIDTH: "bandwidth",
    Kind.NET_RESET: "reset",
    Kind.NET_SILENT: "silent",
    Kind.NET_PARTITION: "partition",
}

# The links a network fault strikes, each a Toxiproxy proxy (or one per broker for Kafka) between
# one client and one server.
LINKS = ("producer_postgres", "producer_kafka", "producer_registry", "consumer_kafka")

# One line per kind, for --help and the docs.
KIND_HELP: Mapping[str, str] = {
    Kind.PRODUCER_KILL: "kill -9 of the producer",
    Kind.CONSUMER_KILL_MERGE: "kill -9 of the consumer (driver and JVM) while a MERGE writes its files",
    Kind.CONSUMER_KILL_PROGRESS: "kill -9 of the consumer while the progress row is written",
    Kind.BROKER_KILL: "kill -9 of a Kafka broker (any, the marker topic's leader, or the "
    "transaction coordinator)",
    Kind.REGISTRY_STOP: "the registry stopped for 8-15 s while a column is added",
    Kind.POSTGRES_CRASH: "PostgreSQL stopped at once (pg_ctl stop -m immediate), then started",
    Kind.NET_LATENCY: "300 ms +- 150 ms of latency each way on one link",
    Kind.NET_BANDWIDTH: "32 KB/s each way on one link",
    Kind.NET_RESET: "connections reset (TCP RST) mid-stream on one link, new ones too",
    Kind.NET_SILENT: "a silent half-open link: nothing passes, nothing is closed",
    Kind.NET_PARTITION: "a full partition of one link (5 s to 5 min, scaled by the cycle)",
    DOUBLE: "two different kinds of the chosen ones at once",
}

# Which family a kind belongs to (the short torture in the suite covers one of each).
FAMILIES: Mapping[Kind, str] = {
    **{k: "process" for k in SINGLE_KINDS if k not in NETWORK_FAULTS},
    **{k: "network" for k in NETWORK_FAULTS},
    Kind.POSTGRES_CRASH: "postgres",
}

# Which broker a broker kill aims at: any one, the leader of the pipeline's transaction-marker
# topic, or the transaction coordinator of the producer's transactional id (the leader of its
# __transaction_state partition).
BROKER_TARGETS = ("any", "marker_topic_leader", "tx_coordinator")

# The producer's registry client retries with backoff from 0.5 s doubling (schemas/registry.py);
# an outage of 8 s or more outlasts its first four retries.
REGISTRY_STOP_S = (8.0, 15.0)

# A partition (and a silent link) lasts 5 s to 5 min; within that, at most 0.4 of the cycle, so
# that it ends (and the next cycle strikes) about on schedule.
PARTITION_S = (5.0, 300.0)


def network_hold_range(kind: Kind, seconds_per_cycle: float) -> tuple[float, float]:
    """How long a network fault of ``kind`` is held: (shortest, longest), scaled by the cycle.
    It strikes at 0.2-0.6 of its cycle; the longest holds end by the cycle's end."""

    def clamp(x: float, lo: float, hi: float) -> float:
        return min(hi, max(lo, x))

    if kind in (Kind.NET_PARTITION, Kind.NET_SILENT):
        return PARTITION_S[0], clamp(0.4 * seconds_per_cycle, *PARTITION_S)
    if kind is Kind.NET_RESET:  # every connection reset the moment data passes
        return 1.0, clamp(0.1 * seconds_per_cycle, 1.0, 30.0)
    if kind in (Kind.NET_LATENCY, Kind.NET_BANDWIDTH):
        return 3.0, clamp(0.4 * seconds_per_cycle, 3.0, PARTITION_S[1])
    raise ValueError(f"{kind} is not a network fault")


@dataclass(frozen=True)
class Fault:
    kind: Kind
    broker_target: str = ""  # BROKER_KILL only
    stop_s: float = 0.0  # REGISTRY_STOP only
    link: str = ""  # network faults: one of LINKS
    hold_s: float = 0.0  # network faults: how long the fault is held

    def label(self) -> str:
        if self.kind is Kind.BROKER_KILL:
            return f"{self.kind.value}({self.broker_target})"
        if self.kind is Kind.REGISTRY_STOP:
            return f"{self.kind.value}({self.stop_s:.1f}s)"
        if self.kind in NETWORK_FAULTS:
            return f"{self.kind.value}({self.link},{self.hold_s:.1f}s)"
        return self.kind.value


@dataclass(frozen=True)
class Cycle:
    number: int  # 1-based
    at_s: float  # when in the cycle the fault strikes
    faults: tuple[Fault, ...]  # two for a double fault
    schema_change: bool  # an ADD COLUMN during this cycle


def _fault(rnd: random.Random, kind: Kind, seconds_per_cycle: float) -> Fault:
    if kind is Kind.BROKER_KILL:
        return Fault(kind, broker_target=rnd.choice(BROKER_TARGETS))
    if kind is Kind.REGISTRY_STOP:
        return Fault(kind, stop_s=round(rnd.uniform(*REGISTRY_STOP_S), 1))
    if kind in NETWORK_FAULTS:
        link = rnd.choice(LINKS)
        hold = round(rnd.uniform(*network_hold_range(kind, seconds_per_cycle)), 1)
        return Fault(kind, link=link, hold_s=hold)
    return Fault(kind)


def needs_registry(fault: Fault) -> bool:
    """Whether ``fault`` cuts the producer off its registry: a column is then added while it
    lasts (and not at the cycle's start), so that the producer must register a schema then."""
    return fault.kind is Kind.REGISTRY_STOP or fault.link == "producer_registry"


def parse_faults(text: str) -> tuple[str, ...]:
    """``--faults``: comma-separated kinds (values of Kind, or "double"); empty items ignored."""
    chosen = tuple(dict.fromkeys(k.strip() for k in text.split(",") if k.strip()))
    unknown = [k for k in chosen if k not in CHOICES]
    if unknown or not chosen:
        raise ValueError(
            f"unknown fault kind(s) {unknown}; choose from {', '.join(CHOICES)}"
            if unknown
            else f"no fault kind given; choose from {', '.join(CHOICES)}"
        )
    return chosen


def needs_network(choices: Sequence[str]) -> bool:
    """Whether a run drawing from ``choices`` can strike a network fault (needs the proxies)."""
    kinds = {Kind(c) for c in choices if c != DOUBLE}
    if DOUBLE in choices:
        kinds |= set(double_kinds(choices))
    return bool(kinds & NETWORK_FAULTS.keys())


def double_kinds(choices: Sequence[str]) -> tuple[Kind, ...]:
    """What a double fault draws two of: the chosen single kinds, or all when fewer than two
    are chosen."""
    chosen = tuple(Kind(c) for c in choices if c != DOUBLE)
    return chosen if len(chosen) >= 2 else SINGLE_KINDS


def schedule(
    seed: int, cycles: int, seconds_per_cycle: float, choices: Sequence[str] = CHOICES
) -> list[Cycle]:
    """The whole run's faults, a function of the seed alone (same seed, same run plan).

    ``choices``: fault kinds (values of Kind, or "double") to strike. A double fault is two
    different kinds of ``double_kinds(choices)`` struck together. The draw is balanced, not
    independent: every kind is struck as often as every other, to within one (a kind struck
    inside a double counts, as in ``faults_by_kind``), so that a run of N cycles strikes each
    of K kinds about N/K times rather than leaving one out by chance. 50 cycles over all 11
    kinds and doubles: 5 doubles, every kind exactly 5 times. The seed orders the cycles and
    draws each fault's details (which broker, which link, how long)."""
    unknown = set(choices) - set(CHOICES)
    if unknown or not choices:
        raise ValueError(f"unknown fault kind(s) {sorted(unknown)}; choose from {CHOICES}")
    rnd = random.Random(seed)
    plan = [
        tuple(_fault(rnd, k, seconds_per_cycle) for k in kinds)
        for kinds in _balanced_kinds(rnd, cycles, choices)
    ]
    rnd.shuffle(plan)
    return [
        Cycle(
            n,
            round(rnd.uniform(0.2, 0.6) * seconds_per_cycle, 2),
            faults,
            schema_change=rnd.random() < 0.25,
        )
        for n, faults in enumerate(plan, start=1)
    ]


def _balanced_kinds(
    rnd: random.Random, cycles: int, choices: Sequence[str]
) -> list[tuple[Kind, ...]]:
    """Each cycle's kinds (one, or two for a double), dealt round-robin from one shuffled order
    of the kinds: singles first, then the doubles' pairs from the same deal when they draw from
    the same kinds, so the counts stay within one of each other and a pair (two consecutive
    deals of at least two kinds) never repeats a kind."""
    singles = [Kind(c) for c in choices if c != DOUBLE]
    pairs = list(double_kinds(choices))
    if DOUBLE not in choices:
        doubles = 0
    elif not singles:
        doubles = cycles
    elif pairs == singles:
        # As many doubles as each kind's share of the strikes: d = (cycles + d) / len(kinds).
        doubles = round(cycles / max(len(singles) - 1, 2))
    else:  # a lone single kind, doubles of all kinds: each choice equally often
        doubles = round(cycles / (len(singles) + 1))
    doubles = min(doubles, cycles)

    def deal(kinds: list[Kind]) -> Iterator[Kind]:
        order = rnd.sample(kinds, len(kinds))
        while True:
            yield from order

    single_deal = deal(singles) if singles else iter(())
    pair_deal = single_deal if pairs == singles else deal(pairs)
    out: list[tuple[Kind, ...]] = [(next(single_deal),) for _ in range(cycles - doubles)]
    out += [(next(pair_deal), next(pair_deal)) for _ in range(doubles)]
    return out


def java_string_hash(text: str) -> int:
    """Java's String.hashCode (a signed 32-bit int over UTF-16 code units)."""
    h = 0
    data = text.encode("utf-16-be")
    for i in range(0, len(data), 2):
        h = (31 * h + int.from_bytes(data[i : i + 2], "big")) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h


def transaction_state_partition(transactional_id: str, partitions: int = 50) -> int:
    """The __transaction_state partition whose leader coordinates ``transactional_id``
    (Kafka's TransactionStateManager: Utils.abs(id.hashCode) % partition count, where
    Utils.abs maps Integer.MIN_VALUE to 0)."""
    h = java_string_hash(transactional_id)
    return (0 if h == -(1 << 31) else abs(h)) % partitions


# -- the invariant ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Sums:
    """One consistent lake state: the money in each table (a table not in the lake yet: 0)."""

    checking: int
    savings: int
    history: int  # sum of history.delta: every change of money in savings is logged there
    rows: int  # rows in the three tables (0: before the opening transaction)


def invariant_violation(s: Sums, total: int) -> str | None:
    """None when the state is one the workload can produce at a transaction boundary.

    Every transaction keeps checking + savings == total (money moves between the tables,
    never appears or vanishes) and savings == history (each change of money in savings inserts
    its delta into the keyless history table in the same transaction). Before the opening
    transaction every table is empty (no rows at all: sums of 0 over rows that exist are checked)."""
    if s.savings != s.history:
        return f"savings {s.savings} != history {s.history}"
    if s.checking + s.savings != total and s.rows != 0:
        return f"checking {s.checking} + savings {s.savings} != {total}"
    return None


# -- Kafka: every transaction's events against its END marker -----------------------------------


@dataclass(frozen=True)
class Event:
    """A data event as read from Kafka: only what the END check needs."""

    tx_id: str
    commit_lsn: int
    total_order: int
    collection: str  # schema.table (unquoted, as the END marker names it)


@dataclass(frozen=True)
class End:
    tx_id: str
    event_count: int
    collections: Mapping[str, int]


@dataclass
class EndCheck:
    transactions: int = 0  # distinct END markers
    events: int = 0  # distinct events (by commit_lsn, total_order)
    duplicates: int = 0  # records seen again (same dedup key; identical events)
    problems: list[str] = field(default_factory=list)  # the first few, for the report
    problem_count: int = 0

    def add_problem(self, text: str, keep: int = 20) -> None:
        self.problem_count += 1
        if len(self.problems) < keep:
            self.problems.append(text)


def check_end_counts(events: Iterable[Event], ends: Iterable[End]) -> EndCheck:
    """Dedup events by (commit_lsn, total_order); every transaction's distinct events must be
    exactly its END marker's: the count, the count per table, and total_order 1..event_count.
    An END seen twice must say the same; events of a transaction without an END are a failure
    (the producer commits the END with the transaction's last events)."""
    out = EndCheck()
    seen: set[tuple[int, int]] = set()
    orders: dict[str, list[int]] = {}
    per_table: dict[str, Counter[str]] = {}
    for e in events:
        key = (e.commit_lsn, e.total_order)
        if key in seen:
            out.duplicates += 1
            continue
        seen.add(key)
        orders.setdefault(e.tx_id, []).append(e.total_order)
        per_table.setdefault(e.tx_id, Counter())[e.collection] += 1
    out.events = len(seen)
    by_id: dict[str, End] = {}
    for end in ends:
        old = by_id.setdefault(end.tx_id, end)
        if old != end:
            out.add_problem(f"tx {end.tx_id}: two END markers differ: {old} / {end}")
    out.transactions = len(by_id)
    for tx_id, end in by_id.items():
        got = sorted(orders.get(tx_id, ()))
        # Data events only: the workload emits no transactional logical messages, so every
        # total_order belongs to a table event.
        if got != list(range(1, end.event_count + 1)):
            missing = sorted(set(range(1, end.event_count + 1)) - set(got))
            out.add_problem(
                f"tx {tx_id}: END counts {end.event_count} event(s), Kafka holds {len(got)} "
                f"(missing total_order {missing[:10]})"
            )
        elif dict(per_table.get(tx_id, {})) != dict(end.collections):
            out.add_problem(
                f"tx {tx_id}: per-table counts {dict(per_table.get(tx_id, {}))} != END's "
                f"{dict(end.collections)}"
            )
    for tx_id in orders.keys() - by_id.keys():
        out.add_problem(f"tx {tx_id}: {len(orders[tx_id])} event(s) but no END marker")
    return out


# -- the report ---------------------------------------------------------------------------------


def summary_line(report: Mapping[str, Any]) -> str:
    faults = report["faults_by_kind"]
    kinds = ",".join(f"{k}={v}" for k, v in sorted(faults.items())) or "none"
    recovery = report["longest_recovery_s"]
    uncounted = report.get("cycles_uncounted", 0)
    return (
        f"torture: {'PASS' if report['passed'] else 'FAIL'} seed={report['seed']} "
        f"cycles={report['cycles']}{f' uncounted={uncounted}' if uncounted else ''} "
        f"faults[{kinds}] transactions={report['transactions']} "
        f"rows={report['rows']} events={report['events']} duplicates={report['duplicates']} "
        f"lost={report['lost']} diverged={report['diverged']} "
        f"snapshots_checked={report['snapshots_checked']} "
        f"invariant_violations={report['invariant_violations']} "
        f"end_mismatches={report['end_mismatches']} "
        f"per_kind[{per_kind_text(report.get('per_kind', {}))}] "
        f"longest_recovery_s={_seconds(recovery)}"
    )


def _seconds(value: float | None) -> str:
    return "None" if value is None else f"{value:.1f}"


def per_kind_text(figures: Mapping[str, Mapping[str, Any]]) -> str:
    """``kind:cycles=N,p50=S,p99=S,max=S,batches=N,checked=N`` per kind, ``;`` between kinds."""
    return ";".join(
        f"{k}:cycles={f['cycles']},p50={_seconds(f['recovery_p50_s'])},"
        f"p99={_seconds(f['recovery_p99_s'])},max={_seconds(f['recovery_max_s'])},"
        f"batches={f['batches_committed']},checked={f['snapshots_checked']}"
        for k, f in sorted(figures.items())
    )


def faults_by_kind(plan: Iterable[Cycle]) -> dict[str, int]:
    counts: Counter[str] = Counter()
    for c in plan:
        for f in c.faults:
            counts[f.kind.value] += 1
        if len(c.faults) > 1:
            counts[DOUBLE] += 1
    return dict(counts)


# -- cycles that count, and the figures per kind ---------------------------------------------------


def counts(progress_rows_at_fault: int, progress_rows_after_previous: int) -> bool:
    """A cycle counts only if the consumer committed at least one batch (a new progress row)
    since the previous fault ended: more rows when this one strikes than when that one was over
    (for the first cycle: than none)."""
    return progress_rows_at_fault > progress_rows_after_previous


@dataclass(frozen=True)
class CycleFigures:
    """What the per-kind figures need of one cycle."""

    kinds: tuple[str, ...]  # its faults' kinds ("double" added for two at once)
    counted: bool
    recovery_s: float | None  # None: never recovered
    rows_at_fault: int  # progress rows when its fault struck
    rows_at_next: int  # progress rows when the next cycle's fault struck (or the load stopped)


def cycle_kinds(faults: Sequence[str]) -> tuple[str, ...]:
    """A cycle's kinds from its faults' kinds: each once, and "double" for two at once."""
    kinds = tuple(dict.fromkeys(faults))
    return (*kinds, DOUBLE) if len(faults) > 1 else kinds


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..1] of ``values``; None when there are none."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * q // 1))  # ceil(q * n), at least 1
    return ordered[int(rank) - 1]


def per_kind(cycles: Iterable[CycleFigures], checked: Iterable[int]) -> dict[str, dict[str, Any]]:
    """For each fault kind, over the cycles that count: how many, recovery p50/p99/max, the
    batches committed after its fault (until the next fault), and how many of those batches'
    progress snapshots were checked. ``checked``: the positions (0-based, in commit order) of
    the progress rows whose snapshot the invariant check read."""
    seen = set(checked)
    out: dict[str, dict[str, Any]] = {}
    for c in cycles:
        for kind in c.kinds:
            f = out.setdefault(
                kind,
                {"cycles": 0, "uncounted": 0, "recoveries": [], "never_recovered": 0,
                 "batches_committed": 0, "snapshots_checked": 0},
            )  # fmt: skip
            if not c.counted:
                f["uncounted"] += 1
                continue
            f["cycles"] += 1
            if c.recovery_s is None:
                f["never_recovered"] += 1
            else:
                f["recoveries"].append(c.recovery_s)
            window = range(c.rows_at_fault, max(c.rows_at_fault, c.rows_at_next))
            f["batches_committed"] += len(window)
            f["snapshots_checked"] += sum(1 for i in window if i in seen)
    for f in out.values():
        recoveries = f.pop("recoveries")
        f["recovery_p50_s"] = percentile(recoveries, 0.50)
        f["recovery_p99_s"] = percentile(recoveries, 0.99)
        f["recovery_max_s"] = max(recoveries) if recoveries else None
    return out
