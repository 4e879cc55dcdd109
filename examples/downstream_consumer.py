"""A downstream consumer of walbridge's topics in plain Python: whole source transactions, in
commit order, each event applied once, into an in-memory copy of the tables.

What it shows (docs/downstream.md):
- confluent-kafka's DeserializingConsumer with the registry's AvroDeserializer for keys and
  values (writer schemas fetched by id: new columns simply appear as new dict keys);
- `isolation.level=read_committed`, so a producer running with Kafka transactions never shows
  this reader an aborted write;
- the transaction topic's END markers (one partition: commit order) telling when every event
  of a transaction on the tables read here has arrived (`data_collections` counts per table);
- the dedup key (commit_lsn, total_order): copies redelivered after a producer crash collapse;
- `unchanged_toast`: a column PostgreSQL did not resend keeps the value this reader holds.

The in-memory tables stand in for a real sink. A real sink stores `last_commit_lsn` in the
same write as the data it applies (one database transaction), and commits Kafka offsets only
afterwards: after a restart it skips every transaction at or below it.

    python examples/downstream_consumer.py --bootstrap localhost:9092 \\
        --registry http://localhost:8081 --prefix shop --table public.orders --table public.lines

Each applied transaction is printed as a JSON line; with --idle-exit-s N the script stops after
N seconds without a new record and prints the tables' final state as one JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter, deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, cast

from confluent_kafka import DeserializingConsumer, KafkaError
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer

Event = dict[str, Any]
Key = tuple[tuple[str, Any], ...]


class StreamError(Exception):
    """The stream holds something this reader cannot apply without guessing."""


@dataclass
class Transactions:
    """Assembles whole transactions from data events and END markers. Pure: no I/O.

    Data topics have several partitions, so a transaction's events may arrive before or after
    its END marker and interleaved with other transactions'; the transaction topic has one
    partition, so its markers arrive in commit order. A transaction is complete when, for each
    table read here, as many distinct events (by total_order) arrived as its END counts.
    """

    tables: frozenset[str]  # "schema.table", as data_collections name them
    last_commit_lsn: int = -1  # of the last transaction handed out (a real sink stores it)
    _events: dict[str, dict[int, tuple[Any, Event]]] = field(default_factory=dict)
    _ends: deque[Event] = field(default_factory=deque)

    def add_event(self, key: dict[str, Any] | None, event: Event) -> None:
        tx = event["transaction"]
        if tx is None:
            raise StreamError(f"event outside a transaction: {event['source']}")
        if event["source"]["commit_lsn"] <= self.last_commit_lsn:
            return  # a copy of an event already applied (redelivered after a crash)
        # Keyed by total_order: a redelivered copy replaces its identical twin.
        self._events.setdefault(tx["id"], {})[tx["total_order"]] = (key, event)

    def add_marker(self, marker: Event) -> None:
        if marker["status"] != "END" or marker["commit_lsn"] <= self.last_commit_lsn:
            return
        if self._ends and self._ends[-1]["commit_lsn"] >= marker["commit_lsn"]:
            return  # a redelivered END (markers arrive in commit order)
        self._ends.append(marker)

    def complete(self) -> Iterator[tuple[Event, list[tuple[Any, Event]]]]:
        """Every transaction now complete, oldest first; stops at the first one still waiting."""
        while self._ends:
            end = self._ends[0]
            want = {
                c["data_collection"]: c["event_count"]
                for c in end["data_collections"]
                if c["data_collection"] in self.tables
            }
            got = self._events.get(end["id"], {})
            counts = Counter(table_of(e) for _, e in got.values())
            if any(counts[table] < n for table, n in want.items()):
                return
            self._ends.popleft()
            self._events.pop(end["id"], None)
            self.last_commit_lsn = end["commit_lsn"]
            yield end, [got[order] for order in sorted(got)]


def table_of(event: Event) -> str:
    return f"{event['source']['schema']}.{event['source']['table']}"


@dataclass
class Tables:
    """The applied state: per table, rows by key (or a list of rows for tables without one)."""

    keyed: dict[str, dict[Key, dict[str, Any]]] = field(default_factory=dict)
    appended: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    def apply(self, key: dict[str, Any] | None, event: Event, replaced: dict[Key, Event]) -> None:
        table, op = table_of(event), event["op"]
        if op == "t":
            self.keyed.pop(table, None)
            self.appended.pop(table, None)
            return
        if key is None:  # no replica identity: append-only
            if op in ("c", "r"):
                self.appended.setdefault(table, []).append(event["after"])
            return
        rows = self.keyed.setdefault(table, {})
        k: Key = tuple(sorted(key.items()))
        if op == "d":
            old = rows.pop(k, None)
            if old is not None:
                replaced[k] = old  # a key change's create may need its unchanged TOAST values
            return
        row = dict(event["after"])
        for column in event["unchanged_toast"]:
            # Not resent by PostgreSQL (DEFAULT identity): the value this reader holds, from the
            # same key, or for a key change's create from the row its `before` names.
            source = rows.get(k)
            if source is None and event["before"] is not None:
                old_key = tuple(sorted((name, event["before"][name]) for name in key))
                source = replaced.get(old_key)
            if source is None:
                raise StreamError(
                    f"{table}: unchanged TOAST column {column!r} for key {key} at commit_lsn "
                    f"{event['source']['commit_lsn']}, and no earlier value to keep: read the "
                    "topic from its beginning (or from a snapshot)"
                )
            row[column] = source[column]
        rows[k] = row


def consumer(args: argparse.Namespace) -> DeserializingConsumer:
    registry = SchemaRegistryClient({"url": args.registry})
    avro = AvroDeserializer(registry)  # writer schema by the id in each record's header
    return DeserializingConsumer(
        {
            "bootstrap.servers": args.bootstrap,
            "group.id": args.group,
            "key.deserializer": avro,
            "value.deserializer": avro,
            # Never see writes of aborted Kafka transactions (librdkafka's default, stated).
            "isolation.level": "read_committed",
            "auto.offset.reset": "earliest",
            # Offsets are committed only after the sink stored what they cover (see the top).
            "enable.auto.commit": False,
        }
    )


def run(args: argparse.Namespace) -> Tables:
    tables = frozenset(args.table)
    marker_topic = f"{args.prefix}.transaction"
    data_topics = [f"{args.prefix}.{t}" for t in sorted(tables)]
    assembler, state = Transactions(tables), Tables()
    c = consumer(args)
    c.subscribe([*data_topics, marker_topic])
    last_record = time.monotonic()
    try:
        while args.idle_exit_s is None or time.monotonic() - last_record < args.idle_exit_s:
            msg = c.poll(0.5)
            if msg is None:
                continue
            err = msg.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    continue
                raise StreamError(f"Kafka: {err}")
            last_record = time.monotonic()
            # The AvroDeserializer's dicts (the client's type hints say bytes).
            value = cast(Event, msg.value())
            if msg.topic() == marker_topic:
                assembler.add_marker(value)
            else:
                assembler.add_event(cast(dict[str, Any] | None, msg.key()), value)
            for end, events in assembler.complete():
                if not events:
                    continue  # only tables this reader does not read
                replaced: dict[Key, Event] = {}  # rows deleted so far in this transaction
                for key, event in events:
                    state.apply(key, event, replaced)
                print(
                    json.dumps(
                        {
                            "transaction": end["id"],
                            "commit_lsn": end["commit_lsn"],
                            "events": len(events),
                            "ops": "".join(e["op"] for _, e in events),
                        }
                    ),
                    flush=True,
                )
    finally:
        c.close()
    return state


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--registry", required=True)
    ap.add_argument("--prefix", required=True, help="the producer's topic prefix")
    ap.add_argument(
        "--table",
        action="append",
        required=True,
        help="schema.table, repeatable, read from topic <prefix>.<schema>.<table> (names of "
        "[A-Za-z0-9_-] only: the names rule of docs/event-format.md gives other names another topic part)",
    )
    ap.add_argument("--group", default="walbridge-example")
    ap.add_argument("--idle-exit-s", type=float, help="stop after this long without a record")
    args = ap.parse_args(argv)
    state = run(args)
    final = {t: sorted(rows.values(), key=lambda r: json.dumps(r, default=str, sort_keys=True))
             for t, rows in state.keyed.items()}  # fmt: skip
    final.update(state.appended)
    print(json.dumps({"final": final}, default=str, sort_keys=True), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
