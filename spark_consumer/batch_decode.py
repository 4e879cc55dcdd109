"""A batch's records decoded: one Avro pass (Spark's from_avro, or fastavro) per (topic, writer
schema id), a table's writer-schema versions unioned by name and cached, with the table's key
(the newest key schema's, else the one its lake table was created with), whether that key is
unique at the source, and the PostgreSQL names of renamed columns; and the transaction
markers, decoded the same way.

Apart from batch.py because it is the step between framing and the summary with state of its
own (the expressions built once per writer schema): the processor hands it the framed records
and the topics job 1 found, and gets the cached frames back.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from schemas.topics import transaction_topic
from spark_consumer.batch_framing import TopicInfo
from spark_consumer.cache_level import CACHE
from spark_consumer.column_cache import ColumnCache
from spark_consumer.columns import key_fields, row_fields
from spark_consumer.config import ConsumerConfig, Decoder
from spark_consumer.conversions import FieldConversions
from spark_consumer.decode import ENV, envelope_column, event_columns, marker_columns
from spark_consumer.decode_fastavro import with_envelope_fastavro
from spark_consumer.lake_state import LakeTable
from spark_consumer.merge_target import stored_key
from spark_consumer.union import union_all
from spark_consumer.writer_schemas import WriterSchemas

MARKER_SCHEMA = (
    "_topic string, _partition int, _offset long, _first_seen long, _status string, "
    "_tx_id string, _commit_lsn long, _ts_ms long, _event_count long, "
    "_data_collections array<struct<data_collection:string,event_count:long>>, _ok boolean"
)


@dataclass(frozen=True)
class DecodedTable:
    info: TopicInfo
    events: DataFrame  # decoded, cached
    columns: tuple[str, ...]
    key: tuple[str, ...] | None  # None: not known yet (no key schema, no table)
    # Every key of the batch leaves out some source column of every writer schema: a primary
    # key or unique index. A key of all columns (REPLICA IDENTITY FULL without a primary key)
    # may repeat at the source.
    unique_key: bool = False
    # Lake column -> PostgreSQL column name, where the producer had to change the name.
    pg_names: Mapping[str, str] = field(default_factory=dict)


class BatchDecoder:
    def __init__(
        self,
        spark: SparkSession,
        config: ConsumerConfig,
        schemas: WriterSchemas,
        conversions: FieldConversions,
        columns: ColumnCache,
        lake_table: Callable[[str], LakeTable],
    ) -> None:
        self.spark = spark
        self.config = config
        self.schemas = schemas
        self.conversions = conversions
        self._columns = columns  # the processor's: expressions built once per process
        # A table's lake state by path (`MergeRunner.lake_table`: read once per process), for
        # the key a table was created with when the batch has no key schema for it.
        self._lake_table = lake_table

    def _decode(self, raw: DataFrame, topic: str, vid: int) -> DataFrame:
        """The records of `topic` written with schema `vid`, with their decoded envelope."""
        rows = raw.filter(
            self._columns.get(
                ("records-of", topic, vid),
                lambda: (F.col("topic") == topic) & (F.col("_vid") == vid),
            )
        )
        text = self.schemas.text(vid)
        if self.config.decoder is Decoder.FASTAVRO:
            return with_envelope_fastavro(rows, text)
        return rows.withColumn(
            ENV, self._columns.get(("envelope", vid), lambda: envelope_column(text))
        )

    def decode_tables(
        self, raw: DataFrame, infos: list[TopicInfo], persisted: list[DataFrame]
    ) -> dict[str, DecodedTable]:
        """One from_avro pass per writer schema id; versions of a table unioned by name.

        Building a table's frames is a few dozen Py4J calls, each analysed in the JVM: about a
        tenth of a second per table, which a batch touching hundreds of tables paid one table
        after the other. The tables are built on the MERGE threads instead (the JVM analyses
        queries side by side); `persist` only marks a frame, nothing runs here."""
        threads = max(1, min(self.config.merge_threads, len(infos)))
        with ThreadPoolExecutor(max_workers=threads) as pool:
            futures = [pool.submit(self._decode_table, raw, info) for info in infos]
        out: dict[str, DecodedTable] = {}
        failed: BaseException | None = None
        for future in futures:  # every cache a table marked is dropped with the batch's
            try:
                table = future.result()
            except BaseException as exc:  # re-raised below, once the others are kept
                failed = failed or exc
                continue
            persisted.append(table.events)
            out[table.info.topic] = table
        if failed is not None:
            raise failed
        return out

    def _decode_table(self, raw: DataFrame, info: TopicInfo) -> DecodedTable:
        frames: list[DataFrame] = []
        columns: list[str] = []
        key = self._key(info, self.config.table_path(info.schema, info.table))
        keys = [key_fields(self.schemas.parsed(k)) for k in info.key_ids] or [key or ()]
        unique = True
        pg_names: dict[str, str] = {}
        # A raw changelog keeps each event's whole before and after rows (lake_options.py).
        images = self.config.lake_tables_config.of_parts(info.schema, info.table).changelog
        for vid in info.value_ids:
            fields = row_fields(self.schemas.parsed(vid))
            pg_names |= {f.name: f.pg_name for f in fields if f.pg_name}
            names = {f.name for f in fields}
            unique &= all(bool(k) and set(k) < names for k in keys)
            select = self._columns.get(
                ("events", vid, key, images),
                partial(event_columns, fields, self.conversions, key or (), images),
            )
            frames.append(self._decode(raw, info.topic, vid).select(*select))
            columns += [c for c in self.conversions.lake_columns(fields) if c not in columns]
        df = union_all(frames, allow_missing=True)
        return DecodedTable(info, df.persist(CACHE), tuple(columns), key, unique, pg_names)

    def decode_markers(
        self, raw: DataFrame, marker_ids: list[int], persisted: list[DataFrame]
    ) -> DataFrame:
        topic = transaction_topic(self.config.topic_prefix)
        select = self._columns.get("markers", marker_columns)
        frames = [self._decode(raw, topic, vid).select(*select) for vid in marker_ids]
        df = (
            union_all(frames)
            if frames
            # An empty RDD has no partitions: no task, no Python worker.
            else self.spark.createDataFrame(self.spark.sparkContext.emptyRDD(), MARKER_SCHEMA)
        )
        df = df.persist(CACHE)
        persisted.append(df)
        return df

    def _key(self, info: TopicInfo, path: str) -> tuple[str, ...] | None:
        if info.key_ids:
            # The newest key schema of the batch names the replica identity columns.
            return key_fields(self.schemas.parsed(max(info.key_ids)))
        return stored_key(self._lake_table(path))
