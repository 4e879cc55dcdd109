"""Capture real pgoutput payloads from the local PostgreSQL as the fuzzing corpus.

    source <(deploy/local/stack env) && .walbridge/venv/bin/python -m tests.fuzz.capture_pgoutput

Runs a workload that makes PostgreSQL send every message kind the decoder knows (Begin, Commit,
Relation, Type, Insert, Update with key and full old rows, Delete, Truncate, Message, Origin,
Stream Start/Stop/Commit/Abort, Begin Prepare, Prepare, Commit/Rollback Prepared, Stream Prepare;
text and binary tuples, NULLs, unchanged TOAST), reads it back through
`pg_logical_slot_peek_binary_changes` (the same bytes as the stream) under several option sets,
and writes one payload per line (`<options> <hex>`) to tests/fuzz/corpus/pgoutput.txt. The file is
committed; re-run this to refresh it (the bytes differ run to run: LSNs, xids, times).
"""

from __future__ import annotations

import os
import sys
import uuid
from pathlib import Path
from typing import Any

import psycopg

CORPUS = Path(__file__).resolve().parent / "corpus" / "pgoutput.txt"

# (label, peek options): proto 1 text and binary, proto 2 streaming, proto 3 two-phase streaming.
OPTION_SETS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("v1", ("proto_version", "1", "messages", "true")),
    ("v1b", ("proto_version", "1", "binary", "true", "messages", "true")),
    ("v2s", ("proto_version", "2", "streaming", "on", "messages", "true")),
    ("v3p", ("proto_version", "3", "streaming", "on", "two_phase", "on", "messages", "true")),
)


def workload(conn: psycopg.Connection[Any], s: str) -> None:
    run = conn.execute
    run(
        f"CREATE TYPE {s}.mood AS ENUM ('sad', 'ok', 'happy');"
        f"CREATE DOMAIN {s}.posint AS int CHECK (VALUE > 0);"
        f"CREATE TABLE {s}.t (id int PRIMARY KEY, n numeric(12,2), f float8, d date,"
        f" ts timestamptz, b bytea, j jsonb, arr int[], m {s}.mood, p {s}.posint, big text,"
        f" iv interval, u uuid);"
        f"ALTER TABLE {s}.t ALTER COLUMN big SET STORAGE EXTERNAL;"
        f"CREATE TABLE {s}.full_t (k text, v text); ALTER TABLE {s}.full_t REPLICA IDENTITY FULL;"
        f"CREATE TABLE {s}.idx_t (id int NOT NULL, code text NOT NULL, v text);"
        f"CREATE UNIQUE INDEX ON {s}.idx_t (code);"
        f"ALTER TABLE {s}.idx_t REPLICA IDENTITY USING INDEX idx_t_code_idx;"
    )
    run(
        f"INSERT INTO {s}.t SELECT g, g / 3.0, 'NaN'::float8 * (g % 2), '0044-03-15 BC'::date + g,"
        f" 'infinity', '\\x00ff', '{{\"a\": [1, null]}}', ARRAY[g, NULL], 'ok', g,"
        f" repeat('x', 3000), '1 year 2 mons 3 days 04:05:06.789', gen_random_uuid()"
        f" FROM generate_series(1, 3) g"
    )
    run(f"INSERT INTO {s}.t (id) VALUES (4)")  # NULLs
    run(f"UPDATE {s}.t SET f = -0.0 WHERE id = 1")  # big unchanged: 'u'
    run(f"UPDATE {s}.t SET id = 10 WHERE id = 2")  # key change: old key 'K'
    run(f"DELETE FROM {s}.t WHERE id = 3")
    run(f"INSERT INTO {s}.full_t VALUES ('a', 'b'), ('c', NULL)")
    run(f"UPDATE {s}.full_t SET v = 'z'")  # full old row: 'O'
    run(f"DELETE FROM {s}.full_t WHERE k = 'c'")
    run(f"INSERT INTO {s}.idx_t VALUES (1, 'x', 'y')")
    run(f"UPDATE {s}.idx_t SET code = 'x2'")
    run(f"ALTER TABLE {s}.t ADD COLUMN late text")
    run(f"INSERT INTO {s}.t (id, late) VALUES (20, 'é€𝄞')")
    run("SELECT pg_logical_emit_message(true, 'fuzz', '\\x0001feff'::bytea)")
    run("SELECT pg_logical_emit_message(false, 'fuzz.nontx', 'plain')")
    run(f"TRUNCATE {s}.full_t, {s}.idx_t RESTART IDENTITY CASCADE")
    # A transaction bigger than logical_decoding_work_mem: streamed under proto 2+.
    with conn.transaction():
        run(
            f"INSERT INTO {s}.full_t SELECT g::text, repeat('s', 200) FROM generate_series(1, 600) g"
        )
    run("BEGIN")  # streamed, then aborted: Stream Abort of the top-level transaction
    run(f"INSERT INTO {s}.full_t SELECT g::text, repeat('r', 200) FROM generate_series(1, 600) g")
    run("ROLLBACK")
    # Two-phase: prepared then committed, prepared then rolled back, a big prepared one.
    for gid, finish, rows in (("fz1", "COMMIT", 2), ("fz2", "ROLLBACK", 2), ("fz3", "COMMIT", 600)):
        run("BEGIN")
        run(f"INSERT INTO {s}.full_t SELECT g::text, 'p' FROM generate_series(1, {rows}) g")
        run(f"PREPARE TRANSACTION '{gid}'")
        run(f"{finish} PREPARED '{gid}'")
    # A subtransaction rolled back inside a streamed transaction: a Stream Abort.
    run("BEGIN")
    run(f"INSERT INTO {s}.full_t SELECT g::text, repeat('a', 200) FROM generate_series(1, 400) g")
    run("SAVEPOINT sp")
    run(f"INSERT INTO {s}.full_t SELECT g::text, repeat('b', 200) FROM generate_series(1, 400) g")
    run("ROLLBACK TO SAVEPOINT sp")
    run("COMMIT")


def capture(dsn: str) -> list[str]:
    s = f"fuzz_{uuid.uuid4().hex[:8]}"
    lines: list[str] = []
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SET logical_decoding_work_mem = '64kB'")
        conn.execute(f"CREATE SCHEMA {s}")
        conn.execute(f"CREATE PUBLICATION {s}_pub FOR TABLES IN SCHEMA {s}")
        conn.execute(
            "SELECT pg_create_logical_replication_slot(%s, 'pgoutput', true, true)", (f"{s}_slot",)
        )
        conn.execute("SELECT pg_replication_origin_create(%s)", (f"{s}_origin",))
        try:
            workload(conn, s)
            # An Origin message: a transaction replayed under a replication origin.
            conn.execute("SELECT pg_replication_origin_session_setup(%s)", (f"{s}_origin",))
            conn.execute(f"INSERT INTO {s}.full_t VALUES ('origin', 'o')")
            conn.execute("SELECT pg_replication_origin_session_reset()")
            for label, options in OPTION_SETS:
                rows = conn.execute(
                    "SELECT data FROM pg_logical_slot_peek_binary_changes(%s, NULL, NULL,"
                    " 'publication_names', %s, " + ", ".join(["%s"] * len(options)) + ")",
                    (f"{s}_slot", f"{s}_pub", *options),
                ).fetchall()
                lines += [f"{label} {bytes(r[0]).hex()}" for r in rows]
        finally:
            conn.execute("SELECT pg_drop_replication_slot(%s)", (f"{s}_slot",))
            conn.execute("SELECT pg_replication_origin_drop(%s)", (f"{s}_origin",))
            conn.execute(f"DROP PUBLICATION {s}_pub")
            conn.execute(f"DROP SCHEMA {s} CASCADE")
    return lines


def main() -> int:
    dsn = os.environ.get("WALBRIDGE_PG_DSN")
    if not dsn:
        print("WALBRIDGE_PG_DSN is required (source <(deploy/local/stack env))", file=sys.stderr)
        return 2
    lines = capture(dsn)
    # Keep the corpus small: the 600-row transactions repeat the same Insert shape, so at most
    # 20 payloads of one (options, tag, length) are kept.
    seen: dict[tuple[str, str, int], int] = {}
    kept = []
    for line in lines:
        label, payload = line.split(" ", 1)
        key = (label, payload[:2], len(payload))
        seen[key] = seen.get(key, 0) + 1
        if seen[key] <= 20:
            kept.append(line)
    CORPUS.parent.mkdir(parents=True, exist_ok=True)
    CORPUS.write_text("\n".join(kept) + "\n")
    tags = sorted({bytes.fromhex(line.split(" ", 1)[1][:2]).decode() for line in kept})
    print(f"{len(kept)} payloads ({len(lines)} captured), tags {''.join(tags)} -> {CORPUS}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
