"""Benchmark: pgoutput decode throughput (messages/s on one core) over a real capture.

Run:
    eval "$(deploy/local/stack env)"
    .walbridge/venv/bin/python tests/bench/bench_decode.py [--dsn DSN] [--rows 500000]
        [--rows-per-tx 10] [--binary] [--reuse] [--passes 3]
    .walbridge/venv/bin/python tests/bench/bench_decode.py --synthetic   # no PostgreSQL needed

Capture (default): creates a throw-away schema with an 8-column table (int8, text,
numeric(12,2), timestamptz, jsonb, bool, text[], enum), a publication and a pgoutput slot;
inserts --rows rows and then updates each of them once, --rows-per-tx rows per transaction;
then reads the exact stream payloads with pg_logical_slot_peek_binary_changes
(proto_version 1) and drops slot, publication and schema. Payloads are stored, length-framed,
under $WALBRIDGE_HOME/bench/ (default .walbridge/bench/, git-ignored) and reused by --reuse.
The default (500k inserts + 500k updates, 10 rows per transaction) gives ~1.2M messages.

--synthetic builds the same mix with the test encoder instead (clearly labelled: secondary
figure, for machines without PostgreSQL).

Reports, from CPU time of this process (process_time: other load on the machine does not
count; best of --passes), for the whole capture and per message type:
  baseline  a bare loop that only slices each frame (payload[0:1])
  decode    Decoder().decode(payload) for every frame, in order
and decode msgs/s, the ratio decode/baseline, and decode vs the 300k msgs/s target.
"""

from __future__ import annotations

import argparse
import os
import struct
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

# Runnable as a plain script from the checkout: make `producer` / `tests` importable.
REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from producer.pgoutput import (  # noqa: E402
    Begin,
    Commit,
    Decoder,
    Insert,
    PgOutputMessage,
    Update,
    Value,
)

TARGET = 300_000
_FRAME = struct.Struct("!I")


# ----------------------------------------------------------------------------- capture


def capture_from_postgres(dsn: str, rows: int, rows_per_tx: int, binary: bool) -> list[bytes]:
    """Run the workload on a private schema and return the pgoutput payloads, in order."""
    import psycopg
    from psycopg import sql

    tag = uuid.uuid4().hex[:10]
    schema, slot, pub = f"bench_decode_{tag}", f"bench_decode_{tag}", f"bench_decode_{tag}"
    table = sql.Identifier(schema, "t")
    mood = sql.Identifier(schema, "mood")
    payloads: list[bytes] = []
    with psycopg.connect(dsn, autocommit=True) as conn:
        try:
            conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
            conn.execute(sql.SQL("CREATE TYPE {} AS ENUM ('sad', 'ok', 'happy')").format(mood))
            conn.execute(
                sql.SQL(
                    "CREATE TABLE {} (id int8 PRIMARY KEY, note text, amount numeric(12,2),"
                    " at timestamptz, doc jsonb, flag bool, labels text[], mood {})"
                ).format(table, mood)
            )
            conn.execute(
                sql.SQL("CREATE PUBLICATION {} FOR TABLE {}").format(sql.Identifier(pub), table)
            )
            conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
            started = time.perf_counter()
            # Server-side loops with COMMIT per batch: one transaction per --rows-per-tx rows
            # without a client round trip each.
            conn.execute(
                sql.SQL(
                    """DO $bench$
                    DECLARE i bigint := 0;
                    BEGIN
                      WHILE i < {rows} LOOP
                        INSERT INTO {table}
                        SELECT g, 'note ' || g || repeat('x', (g % 20)::int),
                               (g * 1.37)::numeric(12,2),
                               timestamptz '2024-05-01 12:00:00+00' + g * interval '1.5 second',
                               jsonb_build_object('i', g, 'tags', jsonb_build_array('a', 'b'),
                                                  'ok', g % 2 = 0),
                               g % 3 = 0, ARRAY['red', 'green', 'n' || g],
                               (enum_range(NULL::{mood}))[1 + (g % 3)::int]
                        FROM generate_series(i + 1, least(i + {per_tx}, {rows})) AS g;
                        COMMIT;
                        i := i + {per_tx};
                      END LOOP;
                      i := 0;
                      WHILE i < {rows} LOOP
                        UPDATE {table} SET note = note || '!', amount = amount + 1,
                               doc = doc || '{{"u": 1}}', flag = NOT flag
                        WHERE id > i AND id <= i + {per_tx};
                        COMMIT;
                        i := i + {per_tx};
                      END LOOP;
                    END $bench$"""
                ).format(
                    table=table,
                    mood=mood,
                    rows=sql.Literal(rows),
                    per_tx=sql.Literal(rows_per_tx),
                )
            )
            print(f"workload: {2 * rows:,} row changes in {time.perf_counter() - started:.1f}s")
            wait_for_flush(conn)
            started = time.perf_counter()
            options = ["proto_version", "1", "publication_names", pub]
            if binary:
                options += ["binary", "true"]
            with conn.transaction(), conn.cursor(name="bench_decode_peek") as cur:
                cur.itersize = 20_000
                cur.execute(
                    sql.SQL(
                        "SELECT data FROM pg_logical_slot_peek_binary_changes(%s, NULL, NULL, {})"
                    ).format(sql.SQL(", ").join(sql.Literal(o) for o in options)),
                    (slot,),
                )
                payloads.extend(bytes(row[0]) for row in cur)
            print(f"peek: {len(payloads):,} payloads in {time.perf_counter() - started:.1f}s")
        finally:
            # A forgotten slot holds WAL forever: always drop what we created.
            conn.execute(
                "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots"
                " WHERE slot_name = %s",
                (slot,),
            )
            conn.execute(sql.SQL("DROP PUBLICATION IF EXISTS {}").format(sql.Identifier(pub)))
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
    return payloads


def wait_for_flush(conn: Any, timeout: float = 60.0) -> None:
    """The peek functions decode only flushed WAL; with synchronous_commit off the last commits
    may not be flushed yet, so wait until everything written so far is."""
    target = conn.execute("SELECT pg_current_wal_insert_lsn()").fetchone()[0]
    deadline = time.monotonic() + timeout
    while not conn.execute("SELECT pg_current_wal_flush_lsn() >= %s::pg_lsn", (target,)).fetchone()[
        0
    ]:
        if time.monotonic() > deadline:
            raise RuntimeError(f"WAL not flushed up to {target} after {timeout}s")
        time.sleep(0.05)


def synthetic_capture(rows: int, rows_per_tx: int) -> list[bytes]:
    """The same message mix built with the test encoder (values shaped like the real ones)."""
    from tests.support.pgoutput_encoder import encode

    def row(g: int, updated: bool) -> tuple[Value, ...]:
        note = f"note {g}{'x' * (g % 20)}{'!' if updated else ''}"
        doc = f'{{"i": {g}, "ok": {"true" if g % 2 == 0 else "false"}, "tags": ["a", "b"]'
        doc += ', "u": 1}' if updated else "}"
        secs = 43200 + g * 1.5
        at = f"2024-05-{1 + int(secs // 86400) % 28:02d} {int(secs % 86400 // 3600):02d}:"
        at += f"{int(secs % 3600 // 60):02d}:{secs % 60:06.3f}+00"
        flag = (g % 3 == 0) != updated
        fields = (
            str(g), note, f"{g * 1.37 + (1 if updated else 0):.2f}", at, doc,
            "t" if flag else "f", f"{{red,green,n{g}}}", ("sad", "ok", "happy")[g % 3],
        )  # fmt: skip
        return tuple(Value(f.encode(), False) for f in fields)

    out: list[bytes] = []
    lsn, xid = 0x1_0000_0000, 1000
    for updated in (False, True):
        for first in range(1, rows + 1, rows_per_tx):
            xid += 1
            out.append(encode(Begin(lsn + 4096, 770_000_000_000_000 + xid, xid)))
            for g in range(first, min(first + rows_per_tx, rows + 1)):
                message: PgOutputMessage = (
                    Update(None, 16385, None, None, row(g, True))
                    if updated
                    else Insert(None, 16385, row(g, False))
                )
                out.append(encode(message))
            out.append(encode(Commit(0, lsn + 4096, lsn + 4200, 770_000_000_000_000 + xid)))
            lsn += 8192
    return out


def write_frames(path: Path, payloads: list[bytes]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with tmp.open("wb") as f:
        for p in payloads:
            f.write(_FRAME.pack(len(p)))
            f.write(p)
    tmp.replace(path)


def read_frames(path: Path) -> list[bytes]:
    data = path.read_bytes()
    out: list[bytes] = []
    pos = 0
    while pos < len(data):
        (length,) = _FRAME.unpack_from(data, pos)
        out.append(data[pos + 4 : pos + 4 + length])
        pos += 4 + length
    return out


# ----------------------------------------------------------------------------- timing


def cpu_seconds(run: Callable[[], None], passes: int) -> float:
    """Best CPU time of ``passes`` runs (process_time: one core, other processes excluded)."""
    best = float("inf")
    for _ in range(passes):
        start = time.process_time()
        run()
        best = min(best, time.process_time() - start)
    return best


def baseline_loop(frames: list[bytes]) -> Callable[[], None]:
    def run() -> None:
        for payload in frames:
            payload[0:1]

    return run


def decode_loop(frames: list[bytes]) -> Callable[[], None]:
    def run() -> None:
        decode = Decoder().decode
        for payload in frames:
            decode(payload)

    return run


def by_type(frames: list[bytes]) -> Iterator[tuple[str, list[bytes]]]:
    """Frames grouped by message type; streams are not involved in the capture."""
    decoder = Decoder()
    groups: dict[str, list[bytes]] = {}
    for payload in frames:
        groups.setdefault(type(decoder.decode(payload)).__name__, []).append(payload)
    yield from sorted(groups.items(), key=lambda kv: -len(kv[1]))


def report(label: str, frames: list[bytes], passes: int) -> None:
    n = len(frames)
    sizes = sorted(len(p) for p in frames)
    print(f"\n== {label}: {n:,} messages, median payload {sizes[n // 2]} bytes")
    counts = Counter(p[:1].decode("latin-1") for p in frames)
    print("   tags: " + ", ".join(f"{t!r}={c:,}" for t, c in counts.most_common()))
    base = cpu_seconds(baseline_loop(frames), passes)
    dec = cpu_seconds(decode_loop(frames), passes)
    base_rate, dec_rate = n / base, n / dec
    print(f"   {'type':<10} {'messages':>10} {'baseline/s':>14} {'decode/s':>12} {'ratio':>8}")
    print(
        f"   {'ALL':<10} {n:>10,} {base_rate:>14,.0f} {dec_rate:>12,.0f} {dec_rate / base_rate:>8.4f}"
    )
    for name, group in by_type(frames):
        if len(group) < 1000:
            continue  # Relation/Type: a handful, too few to time
        g_base = len(group) / cpu_seconds(baseline_loop(group), passes)
        g_dec = len(group) / cpu_seconds(decode_loop(group), passes)
        print(
            f"   {name:<10} {len(group):>10,} {g_base:>14,.0f} {g_dec:>12,.0f} {g_dec / g_base:>8.4f}"
        )
    verdict = "meets" if dec_rate >= TARGET else "BELOW"
    print(
        f"   decode rate {dec_rate:,.0f} msgs/s = {dec_rate / TARGET:.2f} x the {TARGET:,} target"
        f" ({verdict}); decode/baseline ratio {dec_rate / base_rate:.4f}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dsn", default=os.environ.get("WALBRIDGE_PG_DSN"))
    parser.add_argument("--rows", type=int, default=500_000, help="rows inserted, then updated")
    parser.add_argument("--rows-per-tx", type=int, default=10)
    parser.add_argument("--binary", action="store_true", help="capture with binary 'true'")
    parser.add_argument("--reuse", action="store_true", help="reuse a stored capture if present")
    parser.add_argument(
        "--synthetic", action="store_true", help="encoder-made capture, no PostgreSQL"
    )
    parser.add_argument("--passes", type=int, default=3, help="timed passes; the best counts")
    parser.add_argument("--capture-dir", type=Path, default=None)
    args = parser.parse_args()

    home = os.environ.get("WALBRIDGE_HOME")
    capture_dir = args.capture_dir or (
        Path(home) / "bench" if home else Path(tempfile.gettempdir()) / "walbridge-bench"
    )
    if args.synthetic:
        frames = synthetic_capture(args.rows, args.rows_per_tx)
        report("SYNTHETIC capture (test encoder, not PostgreSQL)", frames, args.passes)
        return 0
    if not args.dsn:
        parser.error("no --dsn and no WALBRIDGE_PG_DSN (or use --synthetic)")
    mode = "binary" if args.binary else "text"
    path = capture_dir / f"pgoutput_v1_{mode}_{args.rows}x{args.rows_per_tx}.frames"
    if args.reuse and path.exists():
        frames = read_frames(path)
        print(f"reusing {path}")
    else:
        frames = capture_from_postgres(args.dsn, args.rows, args.rows_per_tx, args.binary)
        write_frames(path, frames)
        print(f"stored {path}")
    report(
        f"PostgreSQL capture (proto 1, {mode} values, {args.rows_per_tx} rows/tx)",
        frames,
        args.passes,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
