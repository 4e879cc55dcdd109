"""Server-side preconditions: wal_level, the slot and the publication.

Catalog queries run over an ordinary psycopg connection with bound parameters and
psycopg.sql composition; only walsender commands (IDENTIFY_SYSTEM, SHOW,
CREATE_REPLICATION_SLOT) use the replication connection.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from producer.pgoutput import parse_lsn
from producer.replication.commands import (
    IDENTIFY_SYSTEM,
    alter_slot_failover_command,
    create_slot_command,
)
from producer.replication.config import ReplicationConfig
from producer.replication.connection import WalsenderConnection
from producer.replication.errors import ErrorKind, ReplicationError
from producer.replication.identifiers import TableName

log = logging.getLogger(__name__)

_DUPLICATE_OBJECT = "42710"


@dataclass(frozen=True)
class SystemIdentity:
    """IDENTIFY_SYSTEM's answer."""

    system_id: str
    timeline: int
    xlogpos: int
    dbname: str


@dataclass(frozen=True)
class SlotState:
    """What the producer needs to know about an existing slot (pg_replication_slots)."""

    slot_name: str
    plugin: str | None
    slot_type: str
    database: str | None
    active_pid: int | None
    confirmed_flush_lsn: int | None
    two_phase: bool
    wal_status: str | None
    # Columns later majors added are None where the server lacks them: conflicting (16+),
    # invalidation_reason, failover and synced (17+).
    restart_lsn: int | None = None
    safe_wal_size: int | None = None
    conflicting: bool | None = None
    invalidation_reason: str | None = None
    failover: bool | None = None
    synced: bool | None = None


def slot_state_from_row(row: Mapping[str, Any]) -> SlotState:
    """A pg_replication_slots row as ``to_jsonb`` renders it: every column the server has,
    whatever its major, so one query serves 15 to 18 (pure)."""

    def lsn(key: str) -> int | None:
        value = row.get(key)
        return parse_lsn(value) if value else None

    def flag(key: str) -> bool | None:
        value = row.get(key)
        return None if value is None else bool(value)

    safe = row.get("safe_wal_size")
    return SlotState(
        slot_name=str(row["slot_name"]),
        plugin=row.get("plugin"),
        slot_type=str(row.get("slot_type")),
        database=row.get("database"),
        active_pid=row.get("active_pid"),
        confirmed_flush_lsn=lsn("confirmed_flush_lsn"),
        two_phase=bool(row.get("two_phase")),
        wal_status=row.get("wal_status"),
        restart_lsn=lsn("restart_lsn"),
        safe_wal_size=None if safe is None else int(safe),
        conflicting=flag("conflicting"),
        invalidation_reason=row.get("invalidation_reason"),
        failover=flag("failover"),
        synced=flag("synced"),
    )


# The slot (NULL when missing) and the server's WAL position in one round trip; a standby has
# no current WAL insert position, its replay position stands in.
_SLOT_QUERY = """
SELECT to_jsonb(s),
       (CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn()
             ELSE pg_current_wal_lsn() END)::text
  FROM (SELECT 1) AS one
  LEFT JOIN pg_replication_slots AS s ON s.slot_name = %s
"""


def observe_slot(session: psycopg.Connection[Any], slot: str) -> tuple[SlotState | None, int]:
    """The slot as the server shows it now (None: there is none) and the server's WAL position."""
    row = session.execute(_SLOT_QUERY, (slot,)).fetchone()
    assert row is not None  # the left join always returns one row
    doc, position = row
    return (None if doc is None else slot_state_from_row(doc)), parse_lsn(position or "0/0")


@dataclass(frozen=True)
class SlotInfo:
    """The slot we stream from. ``snapshot_name`` / ``consistent_point`` are set only when
    this call created it with an exported snapshot; the snapshot stays valid until the next
    command on the replication connection (i.e. until streaming starts)."""

    slot_name: str
    created: bool
    consistent_point: int | None
    snapshot_name: str | None
    confirmed_flush_lsn: int | None
    failover: bool | None = None  # None: the server has no failover slots (before 17)


@dataclass(frozen=True)
class PublicationInfo:
    name: str
    created: bool
    all_tables: bool
    tables: tuple[TableName, ...]
    publish_via_partition_root: bool
    publishes_truncate: bool
    # Whether a partitioned table (or a partition) is published: only then does
    # publish_via_partition_root change what the stream carries.
    publishes_partitions: bool = False


def identify_system(conn: WalsenderConnection) -> SystemIdentity:
    rows = conn.command(IDENTIFY_SYSTEM)
    system_id, timeline, xlogpos, dbname = rows[0]
    if system_id is None or timeline is None or xlogpos is None:
        raise ReplicationError(
            ErrorKind.PROTOCOL, f"unexpected IDENTIFY_SYSTEM row {rows[0]!r}", slot=conn.slot
        )
    if dbname is None:
        raise ReplicationError(
            ErrorKind.CONFIG,
            "the connection is not bound to a database (logical decoding needs one)",
            slot=conn.slot,
        )
    return SystemIdentity(system_id, int(timeline), parse_lsn(xlogpos), dbname)


def check_wal_level(conn: WalsenderConnection) -> None:
    # SHOW is a walsender command in database mode, so no extra connection is needed.
    ((level,),) = conn.command(b"SHOW wal_level")
    if level != "logical":
        raise ReplicationError(
            ErrorKind.WAL_LEVEL,
            f"wal_level is {level!r}; logical decoding needs wal_level = logical "
            "(ALTER SYSTEM SET wal_level = logical, then restart PostgreSQL)",
            slot=conn.slot,
        )


def inspect_slot(session: psycopg.Connection[Any], slot: str) -> SlotState | None:
    return observe_slot(session, slot)[0]


def check_slot_usable(state: SlotState, *, dbname: str) -> None:
    """Refuse a slot we must not stream from; each refusal says what to do about it."""
    if state.slot_type != "logical" or state.plugin != "pgoutput":
        raise ReplicationError(
            ErrorKind.SLOT_MISMATCH,
            f"slot is a {state.slot_type} slot with plugin {state.plugin!r}, not a pgoutput "
            "logical slot; drop it or choose another slot name",
            slot=state.slot_name,
            lsn=state.confirmed_flush_lsn,
        )
    if state.database != dbname:
        raise ReplicationError(
            ErrorKind.SLOT_MISMATCH,
            f"slot belongs to database {state.database!r}, not {dbname!r}",
            slot=state.slot_name,
            lsn=state.confirmed_flush_lsn,
        )
    if state.active_pid is not None:
        raise ReplicationError(
            ErrorKind.SLOT_ACTIVE,
            f"slot is in use by the process with pid {state.active_pid}; "
            "stop that consumer or use another slot",
            slot=state.slot_name,
            lsn=state.confirmed_flush_lsn,
        )
    if state.wal_status == "lost" or state.invalidation_reason or state.conflicting:
        # The producer classifies this as a slot loss first (producer.slot_loss); a client
        # used on its own still refuses to stream from such a slot.
        raise ReplicationError(
            ErrorKind.SLOT_LOST,
            f"slot was invalidated (wal_status {state.wal_status!r}, invalidation_reason "
            f"{state.invalidation_reason!r}); it must be dropped and recreated, followed by a "
            "new snapshot",
            slot=state.slot_name,
            lsn=state.confirmed_flush_lsn,
        )


def ensure_slot(
    conn: WalsenderConnection,
    session: psycopg.Connection,
    config: ReplicationConfig,
    *,
    dbname: str,
    failover: bool = False,
    export_snapshot: bool = False,
) -> SlotInfo:
    """Reuse the configured slot, or create it (when allowed) over the replication connection;
    ``failover``: create it as a failover slot (the caller checked the server has them)."""
    state = inspect_slot(session, config.slot)
    if state is None:
        if not config.create_slot:
            raise ReplicationError(
                ErrorKind.CONFIG, "slot does not exist and create_slot is off", slot=config.slot
            )
        try:
            return _create_slot(conn, config, export_snapshot=export_snapshot, failover=failover)
        except ReplicationError as exc:
            if exc.sqlstate != _DUPLICATE_OBJECT:
                raise
            # Another process created it between our check and CREATE: inspect what it made.
            state = inspect_slot(session, config.slot)
            if state is None:
                raise
    check_slot_usable(state, dbname=dbname)
    is_failover = state.failover
    if failover and state.failover is False:
        is_failover = _failover_for_existing(conn, config)
    log.info(
        "reusing replication slot",
        extra={
            "slot": config.slot,
            "confirmed_flush_lsn": state.confirmed_flush_lsn,
            "failover": is_failover,
            "synced": state.synced,
        },
    )
    return SlotInfo(config.slot, False, None, None, state.confirmed_flush_lsn, failover=is_failover)


def warn_unless_standbys_wait(conn: WalsenderConnection, slot: str) -> None:
    """A failover slot on a primary without ``synchronized_standby_slots``: the primary may
    send the producer changes no standby has received, and after a promotion the new primary
    lacks them: Kafka would hold events of transactions the new primary never had, and the
    slot would resume behind them. Worth a warning, not a refusal (the operator decides)."""
    ((value,),) = conn.command(b"SHOW synchronized_standby_slots")
    if not value:
        log.warning(
            "failover slot on a primary with synchronized_standby_slots empty: changes may "
            "reach Kafka before any standby has them, and a failover would lose them on the "
            "database side; set synchronized_standby_slots to the standbys' physical slots",
            extra={"slot": slot},
        )


def _failover_for_existing(conn: WalsenderConnection, config: ReplicationConfig) -> bool:
    """A slot created before failover slots were asked for (or by an older producer): made one
    with ``--failover-slot on``; with ``auto`` only a warning, since altering a slot someone
    else may manage is the operator's call."""
    command = alter_slot_failover_command(config.slot)
    if config.failover_slot != "on":
        log.warning(
            "the slot is not a failover slot: a promoted standby will not have it, and the "
            "producer will stop with a slot loss after a failover; run "
            f"{command.decode()} on a replication connection, or start once with "
            "--failover-slot on",
            extra={"slot": config.slot},
        )
        return False
    conn.command(command)
    log.info("the slot is now a failover slot", extra={"slot": config.slot})
    return True


def _create_slot(
    conn: WalsenderConnection,
    config: ReplicationConfig,
    *,
    export_snapshot: bool,
    failover: bool,
) -> SlotInfo:
    command = create_slot_command(
        config.slot,
        export_snapshot=export_snapshot,
        two_phase=config.two_phase,
        failover=failover,
    )
    ((slot_name, consistent_point, snapshot_name, _plugin),) = conn.command(command)
    if slot_name is None or consistent_point is None:
        raise ReplicationError(
            ErrorKind.PROTOCOL, "CREATE_REPLICATION_SLOT returned no slot", slot=config.slot
        )
    lsn = parse_lsn(consistent_point)
    log.info(
        "created replication slot",
        extra={
            "slot": slot_name,
            "consistent_point": lsn,
            "snapshot_name": snapshot_name,
            "failover": failover,
        },
    )
    return SlotInfo(slot_name, True, lsn, snapshot_name, lsn, failover=failover)


def ensure_publication(session: psycopg.Connection, config: ReplicationConfig) -> PublicationInfo:
    """Check the publication; create it (table list, or FOR ALL TABLES when no tables are
    configured) when missing. An existing publication is never altered: a difference that
    would change what we stream is an error for the operator to resolve."""
    if config.publish_generated_columns and session.info.server_version < 180000:
        raise ReplicationError(
            ErrorKind.CONFIG,
            "--publish-generated-columns needs PostgreSQL 18+ (earlier majors never publish "
            f"generated columns); the server is {session.info.server_version // 10000}",
            slot=config.slot,
        )
    info = _read_publication(session, config.publication, slot=config.slot)
    created = False
    if info is None:
        if not config.create_publication:
            raise ReplicationError(
                ErrorKind.PUBLICATION,
                f"publication {config.publication!r} does not exist and create_publication is off",
                slot=config.slot,
            )
        try:
            session.execute(_create_publication_sql(config))
            created = True
        except psycopg.errors.DuplicateObject:
            pass  # created concurrently: validated below like any existing publication
        except psycopg.Error as exc:
            raise ReplicationError(
                ErrorKind.PUBLICATION,
                f"can't create publication {config.publication!r}",
                slot=config.slot,
                server_message=str(exc),
                sqlstate=exc.sqlstate,
            ) from exc
        info = _read_publication(session, config.publication, slot=config.slot)
        if info is None:
            raise ReplicationError(
                ErrorKind.PUBLICATION,
                f"publication {config.publication!r} vanished after creation",
                slot=config.slot,
            )
    if config.publish_generated_columns and not created:
        _check_publishes_generated_columns(session, config)
    # FOR ALL TABLES also covers tables created later, so only a table list can miss one.
    unpublished = [] if info.all_tables else _unpublished_tables(session, config)
    _check_publication(info, config, unpublished)
    return PublicationInfo(
        info.name,
        created,
        info.all_tables,
        info.tables,
        info.publish_via_partition_root,
        info.publishes_truncate,
        info.publishes_partitions,
    )


def _create_publication_sql(config: ReplicationConfig) -> sql.Composed:
    target: sql.Composable
    if config.tables:
        target = sql.SQL("FOR TABLE {}").format(
            sql.SQL(", ").join(sql.Identifier(t.schema, t.name) for t in config.tables)
        )
    else:
        target = sql.SQL("FOR ALL TABLES")
    options: list[sql.Composable] = [
        sql.SQL("publish_via_partition_root = {}").format(
            sql.Literal(config.publish_via_partition_root)
        )
    ]
    if config.publish_generated_columns:
        options.append(sql.SQL("publish_generated_columns = stored"))
    return sql.SQL("CREATE PUBLICATION {} {} WITH ({})").format(
        sql.Identifier(config.publication), target, sql.SQL(", ").join(options)
    )


def _check_publishes_generated_columns(
    session: psycopg.Connection, config: ReplicationConfig
) -> None:
    """--publish-generated-columns with an existing publication: it must send them (the
    producer never alters a publication)."""
    row = session.execute(
        "SELECT pubgencols FROM pg_publication WHERE pubname = %s", (config.publication,)
    ).fetchone()
    if row is None or row[0] != "s":
        raise ReplicationError(
            ErrorKind.PUBLICATION,
            f"publication {config.publication!r} does not send stored generated columns and "
            "--publish-generated-columns is on: run ALTER PUBLICATION "
            f"{config.publication} SET (publish_generated_columns = stored), or turn the flag off",
            slot=config.slot,
        )


def _read_publication(
    session: psycopg.Connection, name: str, *, slot: str
) -> PublicationInfo | None:
    row = session.execute(
        "SELECT puballtables, pubinsert, pubupdate, pubdelete, pubtruncate, pubviaroot"
        " FROM pg_publication WHERE pubname = %s",
        (name,),
    ).fetchone()
    if row is None:
        return None
    all_tables, ins, upd, dele, trunc, via_root = row
    if not (ins and upd and dele):
        raise ReplicationError(
            ErrorKind.PUBLICATION,
            f"publication {name!r} must publish insert, update and delete "
            f"(insert={ins}, update={upd}, delete={dele})",
            slot=slot,
        )
    tables = tuple(
        TableName(schema, table)
        for schema, table in session.execute(
            "SELECT schemaname, tablename FROM pg_publication_tables WHERE pubname = %s"
            " ORDER BY 1, 2",
            (name,),
        )
    )
    partitions = session.execute(_PUBLISHES_PARTITIONS, (name,)).fetchone()
    return PublicationInfo(
        name, False, all_tables, tables, via_root, trunc, bool(partitions and partitions[0])
    )


_PUBLISHES_PARTITIONS = """
SELECT EXISTS (
    SELECT 1
    FROM pg_publication_tables pt
    JOIN pg_namespace n ON n.nspname = pt.schemaname
    JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = pt.tablename
    WHERE pt.pubname = %s AND (c.relispartition OR c.relkind = 'p')
)
"""


# pg_publication_tables lists what is published under its published name: the partition root
# with publish_via_partition_root, else the leaf partitions. So a configured table counts as
# published when it, an ancestor, or one of its leaf partitions is listed.
_UNPUBLISHED_TABLES = """
SELECT cfg.schema_name, cfg.table_name
FROM unnest(%(schemas)s::text[], %(tables)s::text[]) AS cfg(schema_name, table_name)
CROSS JOIN LATERAL (
    SELECT to_regclass(format('%%I.%%I', cfg.schema_name, cfg.table_name)) AS relid
) AS t
WHERE NOT EXISTS (
    SELECT 1
    FROM pg_publication_tables pt
    JOIN pg_namespace n ON n.nspname = pt.schemaname
    JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = pt.tablename
    WHERE pt.pubname = %(publication)s
      AND c.oid IN (
        SELECT t.relid  -- the partition functions return nothing for a plain table
        UNION ALL
        SELECT relid FROM pg_partition_ancestors(t.relid)
        UNION ALL
        SELECT relid FROM pg_partition_tree(t.relid) WHERE isleaf
      )
)
ORDER BY 1, 2
"""


def _unpublished_tables(session: psycopg.Connection, config: ReplicationConfig) -> list[TableName]:
    """The configured tables whose changes the publication would not send."""
    if not config.tables:
        return []
    rows = session.execute(
        _UNPUBLISHED_TABLES,
        {
            "schemas": [t.schema for t in config.tables],
            "tables": [t.name for t in config.tables],
            "publication": config.publication,
        },
    ).fetchall()
    return [TableName(schema, table) for schema, table in rows]


def _check_publication(
    info: PublicationInfo, config: ReplicationConfig, unpublished: list[TableName]
) -> None:
    # The setting only matters for partitioned tables: it decides whether their changes arrive
    # under the root's name (one topic, one lake table) or under each leaf's. A publication
    # without partitions is accepted whatever its setting.
    if (
        info.publishes_partitions
        and info.publish_via_partition_root != config.publish_via_partition_root
    ):
        want = "true" if config.publish_via_partition_root else "false"
        raise ReplicationError(
            ErrorKind.PUBLICATION,
            f"publication {info.name!r} publishes partitioned tables with "
            f"publish_via_partition_root = {str(info.publish_via_partition_root).lower()}, "
            f"configured {want}: run ALTER PUBLICATION {info.name} SET "
            f"(publish_via_partition_root = {want}), or set --publish-via-partition-root "
            f"to match (false publishes each leaf partition as a table of its own)",
            slot=config.slot,
        )
    if unpublished:
        raise ReplicationError(
            ErrorKind.PUBLICATION,
            f"publication {info.name!r} does not include {', '.join(map(str, unpublished))}",
            slot=config.slot,
        )
