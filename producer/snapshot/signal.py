"""``walbridge-producer snapshot schema.table ...``: ask a running producer to (re-)read tables.

The request is the signal the producer reads from its own stream (a logical decoding message,
``walbridge.signal``), so it needs no connection to the producer, no extra table and no write
access beyond ``pg_logical_emit_message``; it takes effect when the producer reaches it, and it
is not lost if the producer is down (the slot keeps it).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence

import psycopg

from producer.pgoutput import format_lsn, parse_lsn
from producer.replication.dsn import sql_conninfo
from producer.snapshot.watermarks import SIGNAL_PREFIX
from schemas.table_list import TableListError, parse_table


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="walbridge-producer snapshot",
        description="Snapshot the given tables (schema.table) through the running producer.",
        allow_abbrev=False,
    )
    parser.add_argument(
        "tables",
        nargs="+",
        metavar="schema.table",
        help='PostgreSQL-quoted where a name holds a dot or quote: \'"My Schema"."a.b"\'',
    )
    parser.add_argument("--pg-dsn", default=None, help="env WALBRIDGE_PG_DSN")
    args = parser.parse_args(list(argv))
    dsn = args.pg_dsn or os.environ.get("WALBRIDGE_PG_DSN")
    if not dsn:
        print(
            "walbridge-producer snapshot: --pg-dsn or WALBRIDGE_PG_DSN is required", file=sys.stderr
        )
        return 2
    names: list[str] = []
    for text in args.tables:
        try:
            schema, table = parse_table(text)
        except TableListError as exc:
            print(f"walbridge-producer snapshot: {exc}", file=sys.stderr)
            return 2
        names.append(f"{schema}.{table}")  # the signal names tables as data collections do
    content = json.dumps({"snapshot": list(dict.fromkeys(names))})
    conninfo = sql_conninfo(dsn, application_name="walbridge_signal", connect_timeout=10)
    with psycopg.connect(conninfo, autocommit=True) as conn:
        row = conn.execute(
            "SELECT pg_logical_emit_message(true, %s, %s)::text", (SIGNAL_PREFIX, content)
        ).fetchone()
    assert row is not None
    print(f"snapshot requested for {', '.join(args.tables)} at LSN {format_lsn(parse_lsn(row[0]))}")
    return 0
