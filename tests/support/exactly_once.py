"""What a read_committed reader of an exactly-once producer must find (no tests here)."""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any

from tests.e2e.harness import Pipeline
from tests.support.producer_harness import Record, TopicReader


def check_exactly_once(p: Pipeline, topics: list[str]) -> int:
    """Each event once under its dedup key, BEGIN/END once per transaction with exact counts;
    returns the number of transactions."""
    reader = TopicReader(p.kafka, p.registry)
    data: list[Record] = reader.read_to_end(topics)
    markers = reader.read_to_end([f"{p.prefix}.transaction"])
    seen: set[tuple[int, int]] = set()
    per_tx: Counter[str] = Counter()
    per_tx_table: dict[str, Counter[str]] = defaultdict(Counter)
    for r in data:
        v = r.value
        key = (v["source"]["commit_lsn"], v["transaction"]["total_order"])
        assert key not in seen, f"duplicate event {key} in {r.topic}@{r.partition}:{r.offset}"
        seen.add(key)
        per_tx[v["transaction"]["id"]] += 1
        per_tx_table[v["transaction"]["id"]][f"{v['source']['schema']}.{v['source']['table']}"] += 1
    begins: Counter[str] = Counter()
    ends: dict[str, dict[str, Any]] = {}
    for m in markers:
        tx = m.value["id"]
        if m.value["status"] == "BEGIN":
            begins[tx] += 1
        else:
            assert tx not in ends, f"END of {tx} twice"
            ends[tx] = m.value
    assert set(begins) == set(ends) == set(per_tx), "BEGIN/END without events, or events without"
    assert all(n == 1 for n in begins.values()), "a BEGIN marker twice"
    for tx, end in ends.items():
        assert end["event_count"] == per_tx[tx], f"{tx}: END says {end['event_count']}"
        counts = {c["data_collection"]: c["event_count"] for c in end["data_collections"]}
        assert counts == dict(per_tx_table[tx]), tx
    return len(ends)
