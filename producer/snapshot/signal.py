"""``walbridge-producer snapshot schema.table ...``: ask a running producer to (re-)read tables.

The request is the signal the producer reads from its own stream (a logical decoding message,
``walbridge.signal``), so it needs no connection to the producer, no extra table and no write
access beyond ``pg_logical_emit_message``; it takes effect when the producer reaches it, and it
is not lost if the producer is down (the slot keeps it).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass

import psycopg

from producer.pgoutput import format_lsn, parse_lsn
from producer.replication.dsn import sql_conninfo
from producer.snapshot.watermarks import SIGNAL_PREFIX
from schemas.settings_loader import (
    SettingsError,
    parse_command_line,
    parser_for,
    setting,
    settings_from,
)
from schemas.table_list import TableListError, parse_table


@dataclass(frozen=True)
class SnapshotRequest:
    """The settings of `walbridge-producer snapshot` (the table names are positional)."""

    pg_dsn: str = setting(help="libpq connection string of the source database", secret=True)


def main(argv: Sequence[str]) -> int:
    parser = parser_for(
        SnapshotRequest,
        prog="walbridge-producer snapshot",
        description="Snapshot the given tables (schema.table) through the running producer.",
    )
    parser.add_argument(
        "tables",
        nargs="+",
        metavar="schema.table",
        help='PostgreSQL-quoted where a name holds a dot or quote: \'"My Schema"."a.b"\'',
    )
    try:
        args = parse_command_line(parser, argv)
        request = SnapshotRequest(**settings_from(SnapshotRequest, vars(args), os.environ))
    except SettingsError as exc:
        print(f"walbridge-producer snapshot: configuration error: {exc}", file=sys.stderr)
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
    conninfo = sql_conninfo(request.pg_dsn, application_name="walbridge_signal", connect_timeout=10)
    with psycopg.connect(conninfo, autocommit=True) as conn:
        row = conn.execute(
            "SELECT pg_logical_emit_message(true, %s, %s)::text", (SIGNAL_PREFIX, content)
        ).fetchone()
    assert row is not None
    print(f"snapshot requested for {', '.join(args.tables)} at LSN {format_lsn(parse_lsn(row[0]))}")
    return 0
