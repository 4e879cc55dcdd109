"""Decode framed Avro with Spark: one writer schema id at a time, in the JVM (from_avro).

Input rows are Kafka rows of one topic and one value schema id, with the working columns
`_vid` (value schema id) and `_first_seen`. Undecodable bodies become rows with `_ok = false`
(PERMISSIVE mode) so the caller can name them and stop or quarantine; nothing is dropped here.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.avro.functions import from_avro

from spark_consumer.codegen_stable import sql_name
from spark_consumer.columns import (
    BEFORE,
    COMMIT_LSN,
    FIRST_SEEN,
    OFFSET,
    OK,
    OP,
    PARTITION,
    SCHEMA,
    TABLE,
    TOAST,
    TOPIC,
    TOTAL_ORDER,
    TS_MS,
    TX_ID,
    RowField,
)
from spark_consumer.conversions import FieldConversions
from spark_consumer.framing import body_col
from spark_consumer.key_change_toast import MOVED_FROM_PREFIX

ENV = "_env"


def envelope_column(schema_text: str) -> Column:
    """The decoded envelope (or marker) of the framed `value`, under one writer schema."""
    return from_avro(body_col("value"), schema_text, {"mode": "PERMISSIVE"})


def with_envelope_from_avro(rows: DataFrame, schema_text: str) -> DataFrame:
    return rows.withColumn(ENV, envelope_column(schema_text))


def decoded_ok(required: str) -> Column:
    """Whether the body decoded. Spark 4's from_avro in PERMISSIVE mode gives a struct of nulls,
    not a null, for a body it cannot read (a truncated one, say), so a field every record of
    the schema has (`op` of an envelope, `status` of a marker) tells the two apart. Without it
    a truncated marker read as a marker without commit_lsn and was passed over unreported.
    (SQL, one Py4J call: see codegen_stable.py.)"""
    env, field = sql_name(ENV), sql_name(required)
    return F.expr(f"coalesce({env} IS NOT NULL AND {env}.{field} IS NOT NULL, false)")


def _coords() -> list[Column]:
    return [
        F.col("topic").alias(TOPIC),
        F.col("partition").alias(PARTITION),
        F.col("offset").alias(OFFSET),
        F.col("_first_seen").alias(FIRST_SEEN),
    ]


def table_events(
    decoded: DataFrame,
    fields: tuple[RowField, ...],
    conversions: FieldConversions,
    key: tuple[str, ...] = (),
) -> DataFrame:
    """Flatten decoded envelopes: meta columns + one column per source column."""
    return decoded.select(*event_columns(fields, conversions, key))


def event_columns(
    fields: tuple[RowField, ...],
    conversions: FieldConversions,
    key: tuple[str, ...] = (),
    images: bool = False,
) -> list[Column]:
    """What `table_events` selects from the decoded envelopes of one writer schema.

    `images` adds the event's whole `before` row as the struct column `_before` (the changelog
    table's, changelog.py), in the lake's column forms. Its `after` row is the flat columns of
    a c/r/u event, so the changelog builds it from them rather than the batch caching every
    event's values twice.

    The row is `after` for c/r/u and `before` for d (the old key, or the full old row under
    REPLICA IDENTITY FULL); t carries no row. A create that follows a key change also names
    the replaced row's key in `before`: it becomes the `_from_<key>` columns (key_change_toast.py).
    """
    env = F.col(ENV)
    moved_from = F.when(env["op"] == "c", env["before"])
    from_cols = [
        conversions.apply(moved_from[f.name], f)[0].alias(MOVED_FROM_PREFIX + f.name)
        for f in fields
        if f.name in key
    ]
    row = F.when(env["op"] == "d", env["before"]).otherwise(env["after"])
    toast = F.coalesce(env["unchanged_toast"], F.array().cast("array<string>"))
    # `unchanged_toast` names PostgreSQL columns; the lake's columns are the Avro field names,
    # which differ where the producer sanitized a name (`sp ace` -> `sp_ace`).
    renamed = {f.pg_name: f.name for f in fields if f.pg_name and f.pg_name != f.name}
    if renamed:
        pg_names, lake_names = F.array(*map(F.lit, renamed)), F.array(*map(F.lit, renamed.values()))
        toast = F.transform(
            toast,
            lambda x: F.when(
                F.array_position(pg_names, x) > 0,
                F.element_at(lake_names, F.array_position(pg_names, x).cast("int")),
            ).otherwise(x),
        )
    # A companion column (conversions.py) is unchanged whenever its source column is.
    for name, extra in conversions.companions(fields).items():
        if extra:
            toast = F.when(
                F.array_contains(toast, name), F.concat(toast, F.array(*map(F.lit, extra)))
            ).otherwise(toast)
    return [
        *_coords(),
        env["source"]["schema"].alias(SCHEMA),
        env["source"]["table"].alias(TABLE),
        env["transaction"]["id"].alias(TX_ID),
        env["source"]["commit_lsn"].alias(COMMIT_LSN),
        env["transaction"]["total_order"].alias(TOTAL_ORDER),
        env["op"].alias(OP),
        env["source"]["ts_ms"].alias(TS_MS),
        toast.alias(TOAST),
        decoded_ok("op").alias(OK),
        *[c for f in fields for c in conversions.apply(row[f.name], f)],
        *from_cols,
        *([_before_image(fields, conversions)] if images else []),
    ]


def _before_image(fields: tuple[RowField, ...], conversions: FieldConversions) -> Column:
    before = F.col(ENV)["before"]
    cols = [c for f in fields for c in conversions.apply(before[f.name], f)]
    return F.when(before.isNotNull(), F.struct(*cols)).alias(BEFORE)


def marker_columns() -> list[Column]:
    """What a batch selects from decoded transaction markers."""
    env = F.col(ENV)
    return [
        *_coords(),
        env["status"].alias("_status"),
        env["id"].alias(TX_ID),
        env["commit_lsn"].alias(COMMIT_LSN),
        env["ts_ms"].alias("_ts_ms"),  # the source commit time: the consumer's lag
        env["event_count"].alias("_event_count"),
        env["data_collections"].alias("_data_collections"),
        decoded_ok("status").alias(OK),
    ]
