"""Whether Spark's cap on records per batch cut a batch short (pure: no Spark, no I/O).

Spark's Kafka source plans a batch from the offsets each partition had when it looked, the
"latest" ones. With `maxOffsetsPerTrigger` and more than that many offsets waiting, it gives
each partition with records waiting a share of the cap in proportion to what waits there,
`floor(cap * waiting / total)` (at least 1), and the batch ends there. The batch does not
record whether that happened, and the records it holds cannot tell: the offsets of a
partition also count the commit markers of Kafka transactions, which a reader never sees.

What the offsets log (one entry per planned batch, what a replay reads again) does tell is
where each partition's batch started and ended. A cut batch advanced its partitions by at
least `cap - advanced + 1` offsets in all (`advanced`: how many partitions it advanced), each
partition's share having lost less than one offset to rounding. A batch that advanced by fewer
read every partition to its latest offset. Between the two, a batch that just happened to read
nearly a cap's worth counts as cut: the safe side for the one question asked of it, whether a
snapshot the batch read the end of may still have rows to come. Kafka itself settles such a
batch when nothing has come since (`reads_all`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

# Kafka offsets per topic and partition, as Spark's offsets log writes them:
# {"topic": {"0": 42, "1": 17}}; an offset is the next one to read.
Offsets = dict[str, dict[str, int]]


@dataclass(frozen=True)
class Planned:
    """Where Spark's Kafka source started and ended a batch."""

    start: Offsets  # may be lower than the real start: see cut_by_cap
    end: Offsets


def parse_entry(text: str) -> Offsets:
    """The Kafka source's end offsets in one entry of Spark's offsets log.

    The entry is a version line ("v1"), the batch's metadata (JSON), then one line per source
    of the query ("-" for a source with no offsets yet); this query has one, Kafka."""
    lines = [line for line in text.splitlines() if line.strip()]
    if len(lines) < 3 or not lines[0].startswith("v"):
        raise ValueError(f"not an entry of Spark's offsets log: {text[:200]!r}")
    sources = lines[2:]
    if len(sources) != 1:
        raise ValueError(f"an offsets log entry with {len(sources)} sources; the query has one")
    if sources[0].strip() == "-":
        return {}
    parsed = json.loads(sources[0])
    if not isinstance(parsed, dict):
        raise ValueError(f"not Kafka source offsets: {sources[0][:200]!r}")
    return {
        str(topic): {str(p): int(o) for p, o in partitions.items()}
        for topic, partitions in parsed.items()
    }


def cut_by_cap(start: Offsets, end: Offsets, cap: int) -> bool:
    """Whether the batch from ``start`` to ``end`` may have stopped short of what Kafka had,
    under a cap of ``cap`` offsets per batch (0: no cap).

    ``start`` may be lower than where the batch really started (a partition missing from it
    counts from 0): that only makes a batch look bigger, so more likely cut, never less."""
    if cap <= 0:
        return False
    advanced = total = 0
    for topic, partitions in end.items():
        for partition, offset in partitions.items():
            size = offset - start.get(topic, {}).get(partition, 0)
            if size > 0:
                advanced += 1
                total += size
    return total > cap - advanced


def reads_all(end: Offsets, kafka: Offsets, cut: bool) -> bool:
    """Whether a batch that ended at ``end`` read every record Kafka had when Spark planned
    it, given where Kafka's subscribed partitions end now (``kafka``, read after the planning).

    Spark plans from the partitions it knows, and finds new topics of its pattern only every
    few seconds: a partition Kafka has records in and ``end`` does not name says no. A batch
    the cap may have ``cut`` read everything only if every partition ends now where it ended
    the batch (nothing came since, so nothing was left out); one it did not cut read every
    partition it knew to its end."""
    for topic, partitions in kafka.items():
        for partition, offset in partitions.items():
            planned = end.get(topic, {}).get(partition)
            if planned is None:
                if offset > 0:
                    return False
            elif cut and planned < offset:
                return False
    return True
