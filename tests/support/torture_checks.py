"""The torture run's pure parts (deploy/local/torture; the I/O lives in tests/support/torture.py):
the fault schedule drawn from a seed, the cross-table invariant of one lake state, the Kafka
END-count check, and the summary line. No I/O here, so tests/unit checks each one, including
that each check fails when it should.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
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


SINGLE_KINDS: tuple[Kind, ...] = tuple(Kind)
DOUBLE = "double"  # two faults at once
CHOICES: tuple[str, ...] = (*(k.value for k in SINGLE_KINDS), DOUBLE)

# Which broker a broker kill aims at: any one, the leader of the pipeline's transaction-marker
# topic, or the transaction coordinator of the producer's transactional id (the leader of its
# __transaction_state partition).
BROKER_TARGETS = ("any", "marker_topic_leader", "tx_coordinator")

# The producer's registry client retries with backoff from 0.5 s doubling (schemas/registry.py);
# an outage of 8 s or more outlasts its first four retries.
REGISTRY_STOP_S = (8.0, 15.0)


@dataclass(frozen=True)
class Fault:
    kind: Kind
    broker_target: str = ""  # BROKER_KILL only
    stop_s: float = 0.0  # REGISTRY_STOP only

    def label(self) -> str:
        if self.kind is Kind.BROKER_KILL:
            return f"{self.kind.value}({self.broker_target})"
        if self.kind is Kind.REGISTRY_STOP:
            return f"{self.kind.value}({self.stop_s:.1f}s)"
        return self.kind.value


@dataclass(frozen=True)
class Cycle:
    number: int  # 1-based
    at_s: float  # when in the cycle the fault strikes
    faults: tuple[Fault, ...]  # two for a double fault
    schema_change: bool  # an ADD COLUMN during this cycle


def _fault(rnd: random.Random, kind: Kind) -> Fault:
    if kind is Kind.BROKER_KILL:
        return Fault(kind, broker_target=rnd.choice(BROKER_TARGETS))
    if kind is Kind.REGISTRY_STOP:
        return Fault(kind, stop_s=round(rnd.uniform(*REGISTRY_STOP_S), 1))
    return Fault(kind)


def schedule(
    seed: int, cycles: int, seconds_per_cycle: float, choices: Sequence[str] = CHOICES
) -> list[Cycle]:
    """The whole run's faults, a function of the seed alone (same seed, same run plan).

    ``choices``: fault kinds (values of Kind, or "double") to draw from, each equally likely.
    A double fault is two different single kinds from ``SINGLE_KINDS`` struck together."""
    unknown = set(choices) - set(CHOICES)
    if unknown or not choices:
        raise ValueError(f"unknown fault kind(s) {sorted(unknown)}; choose from {CHOICES}")
    rnd = random.Random(seed)
    plan: list[Cycle] = []
    for n in range(1, cycles + 1):
        choice = rnd.choice(list(choices))
        if choice == DOUBLE:
            kinds = rnd.sample(SINGLE_KINDS, 2)
            faults = tuple(_fault(rnd, k) for k in kinds)
        else:
            faults = (_fault(rnd, Kind(choice)),)
        at = round(rnd.uniform(0.2, 0.6) * seconds_per_cycle, 2)
        plan.append(Cycle(n, at, faults, schema_change=rnd.random() < 0.25))
    return plan


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
    return (
        f"torture: {'PASS' if report['passed'] else 'FAIL'} seed={report['seed']} "
        f"cycles={report['cycles']} faults[{kinds}] transactions={report['transactions']} "
        f"rows={report['rows']} events={report['events']} duplicates={report['duplicates']} "
        f"lost={report['lost']} diverged={report['diverged']} "
        f"snapshots_checked={report['snapshots_checked']} "
        f"invariant_violations={report['invariant_violations']} "
        f"end_mismatches={report['end_mismatches']} "
        f"longest_recovery_s={recovery if recovery is None else f'{recovery:.1f}'}"
    )


def faults_by_kind(plan: Iterable[Cycle]) -> dict[str, int]:
    counts: Counter[str] = Counter()
    for c in plan:
        for f in c.faults:
            counts[f.kind.value] += 1
        if len(c.faults) > 1:
            counts[DOUBLE] += 1
    return dict(counts)
